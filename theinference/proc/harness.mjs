// The student's side of the runner for the TypeScript edition: proc/child.py's twin in Node.js.
//
// Started by theinference.proc.launch as `node [--import tsx] harness.mjs JOB.json`. It speaks
// proc/protocol.py exactly: events go up the pipe whose fd is in THEINFERENCE_PROTOCOL_FD, one JSON
// object a line (LOADED or LOAD_ERROR once, then START and DONE per case), or, where the grader names a
// loopback socket in THEINFERENCE_PROTOCOL_SOCKET instead (a pipe inherited as a Windows handle has no fd
// number here), over that socket, after the token in THEINFERENCE_PROTOCOL_TOKEN; each returned value is
// written to OUT_DIR/case-<i>.npy (float32 arrays, int64 token lists) by this file itself. Async
// adapters are awaited. With `interactive: true` (cache-scaling) the calls come one JSON line at a time,
// {"case": i, "args": [...]}, on the fd in THEINFERENCE_CALLS_FD (or the socket), each only when the grader starts it, and the
// harness exits 0 at its end. The grader counts each call's CPU from outside the process tree
// (proc/calls.py): nothing here times anything.
//
// Plain JavaScript, Node's standard library only: it is copied into the sandbox's stub package.

import { spawnSync } from "node:child_process";
import fs from "node:fs";
import net from "node:net";
import path from "node:path";
import readline from "node:readline";
import { fileURLToPath, pathToFileURL } from "node:url";

const PROTOCOL_FD_ENV = "THEINFERENCE_PROTOCOL_FD";
const CALLS_FD_ENV = "THEINFERENCE_CALLS_FD";
const SOCKET_ENV = "THEINFERENCE_PROTOCOL_SOCKET";
const TOKEN_ENV = "THEINFERENCE_PROTOCOL_TOKEN";
const GO_FD_ENV = "THEINFERENCE_GO_FD";
const HARNESS = fileURLToPath(import.meta.url);
const realExit = process.exit.bind(process);

// A pipe fd inherited from the grader, reopened close-on-exec: processes the student starts do not get it.
function reopen(fd, flags) {
  try {
    const fresh = fs.openSync(`/proc/self/fd/${fd}`, flags);
    fs.closeSync(fd);
    return fresh;
  } catch {
    return fd;
  }
}

function dropPrivileges() {
  const runAs = process.env.THEINFERENCE_RUN_AS;
  delete process.env.THEINFERENCE_RUN_AS;
  if (runAs) {
    process.setgroups([]);
    process.setgid(Number(runAs));
    process.setuid(Number(runAs));
  }
}

let proto = null; // the pipe's fd, or
let channel = null; // the socket the grader named instead, and
let socketLines = null; // the lines the grader sends on it ("go", then an interactive job's calls)

// Started without fork (the monitor's popen_held): wait for the monitor's byte on the hold's pipe, written once it
// has reported this process's pid, before any student code runs; end-of-file instead means it is gone. Over a
// socket the grader says "go" itself, once it knows the pid (and the hold's pipe is a handle there, not an fd).
function awaitGo(overSocket) {
  const token = process.env[GO_FD_ENV];
  delete process.env[GO_FD_ENV];
  if (token === undefined || overSocket) return;
  const fd = Number(token);
  const byte = Buffer.alloc(1);
  let read = 0;
  try {
    read = fs.readSync(fd, byte, 0, 1, null);
  } catch {
    read = 0;
  }
  try {
    fs.closeSync(fd);
  } catch {}
  if (read !== 1 || byte[0] !== 0x31) realExit(1);
}

function send(message) {
  const line = JSON.stringify(message) + "\n";
  if (channel !== null) channel.write(line);
  else fs.writeSync(proto, line);
}

// The grader's loopback socket (HOST:PORT), connected and told the token before any student code runs. A socket
// writes each line as it is sent (to the kernel at once while nothing waits before it), in order; one that
// breaks (the grader gone) ends this process, as a write to a broken pipe does.
async function connect(address, token) {
  const at = address.lastIndexOf(":");
  const socket = net.connect({ host: address.slice(0, at), port: Number(address.slice(at + 1)) });
  await new Promise((resolve, reject) => {
    socket.once("connect", resolve);
    socket.once("error", reject);
  });
  socket.on("error", () => realExit(1));
  socket.setNoDelay(true);
  socket.write(token + "\n");
  return socket;
}

// Before this process exits: what was sent on the socket is written out.
function flushed() {
  return channel === null ? Promise.resolve() : new Promise((resolve) => channel.end(resolve));
}

// Where the student's stdout and stderr files stand now: each case's output is a slice of them.
function outputOffsets() {
  return [1, 2].map((fd) => {
    try {
      return fs.fstatSync(fd).size;
    } catch {
      return 0;
    }
  });
}

// The stack without the harness's and Node's own frames: the student sees only their code.
function studentStack(error) {
  if (!(error instanceof Error) || typeof error.stack !== "string") return `${describeThrown(error)}\n`;
  const lines = error.stack.split("\n");
  const kept = lines.filter(
    (line) =>
      !/^\s+at /.test(line) ||
      !(line.includes(HARNESS) || line.includes("node:internal") || /node_modules[\\/](tsx|esbuild)[\\/]/.test(line)),
  );
  // file:// URLs (ES modules) as the paths the student's editor shows
  return kept.join("\n").replace(/file:\/\/(\/[^\s:)]+)/g, (url) => fileURLToPath(url)) + "\n";
}

function describeThrown(value) {
  if (value instanceof Error) return `${value.name}: ${value.message}`;
  let text;
  try {
    text = JSON.stringify(value);
  } catch {
    text = String(value);
  }
  return `a thrown ${value === null ? "null" : typeof value} (not an Error): ${String(text).slice(0, 200)}`;
}

// A TypeScript compile error -> [file, line]: esbuild's (tsx) "FILE:LINE:COL: ERROR: ...", or the
// "[file:///FILE:LINE:COL]" of Node's own type stripping (swc). JavaScript's own: checkSources.
function syntaxLocation(error) {
  const text = `${error?.message ?? ""}\n${error?.stack ?? ""}`;
  const esbuild = /^(\S.*?):(\d+):(\d+): ERROR: /m.exec(text);
  if (esbuild) return [esbuild[1], Number(esbuild[2])];
  if (/ERR_INVALID_TYPESCRIPT_SYNTAX|ERR_UNSUPPORTED_TYPESCRIPT_SYNTAX/.test(text)) {
    const swc = /\[(file:\/\/[^\]\s]+?):(\d+):\d+\]/.exec(text);
    if (swc) return [fileURLToPath(swc[1]), Number(swc[2])];
  }
  return null;
}

// Node keeps an ES module's syntax error location out of error.stack: find the file with `node --check`,
// the adapters file first, then the course's other sources (node_modules and hidden directories left out).
function checkSources(job) {
  const files = [job.adapters];
  const walk = (dir, depth) => {
    let entries = [];
    try {
      entries = fs.readdirSync(dir, { withFileTypes: true });
    } catch {
      return;
    }
    for (const entry of entries) {
      if (entry.name.startsWith(".") || entry.name === "node_modules" || files.length > 200) continue;
      const full = path.join(dir, entry.name);
      if (entry.isDirectory() && depth < 6) walk(full, depth + 1);
      else if (/\.(m?js|cjs)$/.test(entry.name) && full !== job.adapters) files.push(full);
    }
  };
  walk(job.course_root, 0);
  for (const file of files.filter((f) => /\.(m?js|cjs)$/.test(f))) {
    const done = spawnSync(process.execPath, ["--check", file], { encoding: "utf8", timeout: 20000 });
    const found = /^(.+?):(\d+)\n/.exec(done.stderr ?? "");
    if (done.status !== 0 && found && /SyntaxError/.test(done.stderr)) {
      const excerpt = done.stderr.split("\n\nNode.js")[0].trim();
      return { where: [found[1], Number(found[2])], excerpt: excerpt + "\n" };
    }
  }
  return null;
}

function compileMessage(error) {
  const esbuild = /^\S.*?:\d+:\d+: ERROR: .*$/gm;
  const found = `${error?.message ?? ""}`.match(esbuild);
  return found ? found.join("\n") + "\n" : `${error.name}: ${error.message}\n`;
}

async function load(job) {
  const file = job.adapters;
  const name = path.basename(file);
  let module;
  try {
    module = await import(pathToFileURL(file).href);
  } catch (error) {
    let where = syntaxLocation(error);
    let excerpt = null;
    // A parse error has only Node's frames; a SyntaxError thrown by running code (JSON.parse) has the student's.
    const parsing = !(error?.stack ?? "").split("\n").some((l) => /^\s+at /.test(l) && !l.includes("node:internal"));
    if (!where && error?.name === "SyntaxError" && parsing) ({ where, excerpt } = checkSources(job) ?? {});
    if (where) {
      send({
        event: "load-error",
        kind: "syntax",
        message: `syntax error in ${where[0]}, line ${where[1]}`,
        traceback: excerpt ?? compileMessage(error),
      });
    } else {
      send({
        event: "load-error",
        kind: "import",
        message: `importing ${name} failed: ${describeThrown(error)}`,
        traceback: studentStack(error),
      });
    }
    return null;
  }
  for (const candidate of job.names) {
    if (typeof module[candidate] === "function") return { func: module[candidate], name: candidate };
  }
  // The camelCase name first: it is the one this edition's students write.
  const [expected, ...aliases] = [...job.names.filter((n) => !n.includes("_")), ...job.names.filter((n) => n.includes("_"))];
  const also = aliases.length ? ` (also accepted: ${aliases.join(", ")})` : "";
  send({ event: "load-error", kind: "missing", message: `${name} defines no function '${expected}'${also}` });
  return null;
}

// Where the exported function is written, read from the source (Node does not expose it): for annotations.
function definedAt(file, name) {
  try {
    const lines = fs.readFileSync(file, "utf8").split("\n");
    const pattern = new RegExp(`\\b(function\\s*\\*?\\s*${name}\\b|(const|let|var)\\s+${name}\\s*[:=])`);
    const index = lines.findIndex((line) => pattern.test(line));
    return index >= 0 ? [file, index + 1] : null;
  } catch {
    return null;
  }
}

// ---- the returned value as an array: the messages are child.py's ----

const FLOAT_ARRAYS = [Float32Array, Float64Array];

function typeName(value) {
  if (value === null) return "null";
  if (Array.isArray(value)) return "Array";
  if (ArrayBuffer.isView(value)) return value.constructor.name;
  if (typeof value === "object") return value.constructor?.name ?? "Object";
  return typeof value;
}

// -> {shape, values (flat numbers), float} or {problem}
function toArray(value) {
  const shape = [];
  let probe = value;
  while ((Array.isArray(probe) || (ArrayBuffer.isView(probe) && !(probe instanceof DataView))) && shape.length < 32) {
    shape.push(probe.length);
    if (ArrayBuffer.isView(probe) || probe.length === 0) break;
    probe = probe[0];
  }
  const values = new Float64Array(shape.reduce((a, b) => a * b, 1));
  let filled = 0;
  let float = false;
  let bad = null;
  const walk = (node, depth) => {
    if (bad) return;
    if (depth === shape.length) {
      if (typeof node === "number") {
        if (!Number.isInteger(node)) float = true;
        values[filled++] = node;
      } else if (typeof node === "boolean") {
        values[filled++] = node ? 1 : 0;
      } else if (typeof node === "bigint") {
        values[filled++] = Number(node);
      } else {
        bad = { kind: "type", got: node };
      }
      return;
    }
    const isView = ArrayBuffer.isView(node) && !(node instanceof DataView);
    if (!(Array.isArray(node) || isView) || node.length !== shape[depth] || (isView && depth !== shape.length - 1)) {
      bad = { kind: "ragged", depth };
      return;
    }
    if (isView) {
      if (FLOAT_ARRAYS.some((T) => node instanceof T)) float = true;
      if (node instanceof BigInt64Array || node instanceof BigUint64Array) {
        for (let i = 0; i < node.length; i++) values[filled++] = Number(node[i]);
      } else {
        values.set(node, filled);
        filled += node.length;
      }
      return;
    }
    if (depth === shape.length - 1) {
      // the innermost arrays of numbers: the hot loop (a row of logits is 50257 of them)
      for (let i = 0; i < node.length && !bad; i++) {
        const v = node[i];
        if (typeof v === "number") {
          if (!float && !Number.isInteger(v)) float = true;
          values[filled++] = v;
        } else {
          walk(v, depth + 1);
        }
      }
      return;
    }
    for (let i = 0; i < node.length; i++) walk(node[i], depth + 1);
  };
  walk(value, 0);
  if (bad?.kind === "ragged") {
    return {
      problem:
        `the return value is not an array of numbers (ValueError: setting an array element with a sequence. ` +
        `The requested array has an inhomogeneous shape after ${bad.depth} dimensions. ` +
        `The detected shape was (${shape.slice(0, bad.depth).join(", ")}${bad.depth === 1 ? "," : ""}) + inhomogeneous part.)`,
    };
  }
  if (bad) {
    const inner = shape.length ? ` holding ${typeName(bad.got)}` : "";
    return { problem: `the return value is not numeric (got ${typeName(value)}${inner})` };
  }
  return { shape, values, float };
}

function sizeText(nbytes) {
  if (nbytes >= 2 ** 30) return `${(nbytes / 2 ** 30).toFixed(1).replace(/\.0$/, "")} GB`;
  return `${Math.round(nbytes / 2 ** 20)} MB`;
}

// A .npy file (format 1.0) of the array: float32, or int64 when every element is an integer.
function npyBytes(array) {
  const descr = array.float ? "<f4" : "<i8";
  const dims = array.shape.length === 1 ? `${array.shape[0]},` : array.shape.join(", ");
  let header = `{'descr': '${descr}', 'fortran_order': False, 'shape': (${dims}), }`;
  const unpadded = 10 + header.length + 1;
  header += " ".repeat((64 - (unpadded % 64)) % 64) + "\n";
  const head = Buffer.alloc(10);
  Buffer.from([0x93]).copy(head, 0);
  head.write("NUMPY", 1, "latin1");
  head[6] = 1;
  head[7] = 0;
  head.writeUInt16LE(header.length, 8);
  const data = array.float
    ? Buffer.from(new Float32Array(array.values).buffer)
    : Buffer.from(BigInt64Array.from(array.values, (v) => BigInt(v)).buffer);
  return [Buffer.concat([head, Buffer.from(header, "latin1")]), data];
}

class ExitCalled extends Error {}

async function runCase(func, index, args, job) {
  const done = (message) => send({ event: "done", case: index, output: outputOffsets(), ...message });
  send({ event: "start", case: index, output: outputOffsets() });
  const started = performance.now();
  let value;
  try {
    const running = (async () => func(...args))();
    value = await new Promise((resolve, reject) => {
      abortCase = reject; // an exception no await catches (a timer's, say) ends this case
      running.then(resolve, reject);
    });
  } catch (error) {
    abortCase = null;
    if (error instanceof Uncaught) {
      done({
        status: "error",
        message: `${describeThrown(error.inner)} (thrown outside the adapter's own calls)`,
        traceback: studentStack(error.inner),
      });
    } else if (error instanceof ExitCalled) {
      done({ status: "error", message: error.message, traceback: studentStack(error) });
    } else if (error?.name === "NotImplementedError" || error?.constructor?.name === "NotImplementedError") {
      done({ status: "not-started", message: error.message ? `NotImplementedError: ${error.message}` : "NotImplementedError" });
    } else if (error instanceof RangeError && /allocation failed|out of memory|Invalid typed array length/i.test(error.message)) {
      done({
        status: "error",
        message: `out of memory: the adapter exceeded its memory limit (RangeError: ${error.message})`,
        traceback: studentStack(error),
      });
    } else {
      done({ status: "error", message: describeThrown(error), traceback: studentStack(error) });
    }
    return;
  }
  abortCase = null;
  const seconds = (performance.now() - started) / 1000;
  const array = toArray(value);
  if (array.problem) {
    done({ status: "bad-output", message: array.problem, seconds });
    return;
  }
  const out = path.join(job.out_dir, `case-${index}.npy`);
  const [head, data] = npyBytes(array);
  const cap = job.limits?.file_bytes;
  if (cap && head.length + data.length >= cap) {
    const dtype = array.float ? "float32" : "int64";
    done({
      status: "error",
      message:
        `the adapter's output exceeded ${sizeText(cap)} (it returned ${sizeText(data.length)}, ` +
        `shape [${array.shape.join(", ")}], ${dtype})`,
      seconds,
    });
    return;
  }
  try {
    fs.writeFileSync(out, Buffer.concat([head, data]));
  } catch (error) {
    fs.rmSync(out, { force: true });
    done({ status: "error", message: `the adapter's output could not be saved: ${error.message}`, seconds });
    return;
  }
  done({ status: "ok", file: out, seconds });
}

let abortCase = null; // ends the running case with an exception no await catches

class Uncaught extends Error {
  constructor(inner) {
    super("uncaught");
    this.inner = inner;
  }
}

function guardProcess() {
  process.exit = (code) => {
    throw new ExitCalled(`the adapter called process.exit(${code === undefined ? "" : JSON.stringify(code)})`);
  };
  const fatal = (error) => {
    if (abortCase !== null) {
      abortCase(new Uncaught(error));
    } else {
      process.stderr.write(studentStack(error)); // between calls: the student's output shows it
    }
  };
  process.on("uncaughtException", fatal);
  process.on("unhandledRejection", fatal);
}

async function* callLines(fd) {
  const lines =
    socketLines ??
    readline
      .createInterface({ input: fs.createReadStream(null, { fd: reopen(fd, "r"), encoding: "utf8" }), crlfDelay: Infinity })
      [Symbol.asyncIterator]();
  for (let next = await lines.next(); !next.done; next = await lines.next()) {
    if (next.value.trim()) yield JSON.parse(next.value);
  }
}

async function main() {
  const fd = Number(process.env[PROTOCOL_FD_ENV]);
  const [address, token] = [process.env[SOCKET_ENV], process.env[TOKEN_ENV]];
  for (const name of [PROTOCOL_FD_ENV, SOCKET_ENV, TOKEN_ENV]) delete process.env[name];
  awaitGo(Boolean(address));
  dropPrivileges();
  const job = JSON.parse(fs.readFileSync(process.argv[2], "utf8"));
  // With a socket the inherited pipe (a handle, on Windows) is left as it is: it tells the grader when this ends.
  if (address) {
    channel = await connect(address, token ?? "");
    channel.setEncoding("utf8");
    socketLines = readline.createInterface({ input: channel, crlfDelay: Infinity })[Symbol.asyncIterator]();
    const go = await socketLines.next();
    if (go.done || go.value !== "go") realExit(1);
  } else {
    proto = reopen(fd, "w");
  }
  guardProcess();
  const found = await load(job);
  if (found === null) return;
  const at = definedAt(job.adapters, found.name);
  send({ event: "loaded", ...(at ? { defined_at: at } : {}) });
  if (job.interactive) {
    const callsFd = Number(process.env[CALLS_FD_ENV]);
    delete process.env[CALLS_FD_ENV];
    for await (const call of callLines(callsFd)) await runCase(found.func, call.case, call.args, job);
    return;
  }
  for (let index = job.start; index < job.calls.length; index++) {
    await runCase(found.func, index, job.calls[index], job);
  }
}

main().then(
  () => flushed().then(() => realExit(0)),
  (error) => {
    process.stderr.write(studentStack(error));
    flushed().then(() => realExit(1));
  },
);
