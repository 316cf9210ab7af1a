// My GPT-2 for the course, written against the lecture's description of the model.
// Tensors are flat Float32Arrays in row-major order; each function's comment gives the shapes.

import { readFileSync, existsSync } from "node:fs";
import { dirname, join } from "node:path";

/** Thrown by a function not written yet: the grader reports its stage as "not started". */
export class NotImplementedError extends Error {
  name = "NotImplementedError";
}

export interface Linear {
  weight: Float32Array; // [out, in]: the checkpoint's Conv1D [in, out] transposed at load, so each output is one dot()
  bias: Float32Array; // [out]
  nIn: number;
  nOut: number;
}

export interface Norm {
  weight: Float32Array;
  bias: Float32Array;
}

export interface Layer {
  ln1: Norm;
  cAttn: Linear;
  cProj: Linear;
  ln2: Norm;
  cFc: Linear;
  mlpProj: Linear;
}

export interface Weights {
  wte: Float32Array; // [nVocab, nEmbd], also the LM head
  wpe: Float32Array; // [nCtx, nEmbd]
  layers: Layer[];
  lnF: Norm;
  nVocab: number;
  nEmbd: number;
  nHead: number;
}

// The format: 8 bytes of header length, a JSON header (name -> dtype, shape, byte offsets), then the data.
export function readSafetensors(path: string): Map<string, { shape: number[]; data: Float32Array }> {
  const bytes = readFileSync(path);
  const headerLen = Number(bytes.readBigUInt64LE(0));
  const header = JSON.parse(bytes.subarray(8, 8 + headerLen).toString("utf8"));
  delete header.__metadata__;
  const tensors = new Map<string, { shape: number[]; data: Float32Array }>();
  for (const [name, info] of Object.entries<any>(header)) {
    const [start, end] = info.data_offsets as [number, number];
    const raw = bytes.subarray(8 + headerLen + start, 8 + headerLen + end);
    const count = (info.shape as number[]).reduce((a, b) => a * b, 1);
    let data = new Float32Array(count);
    if (info.dtype === "F32") {
      data = new Float32Array(raw.buffer.slice(raw.byteOffset, raw.byteOffset + 4 * count)); // a copy, aligned
    } else if (info.dtype === "F64") {
      for (let i = 0; i < count; i++) data[i] = raw.readDoubleLE(8 * i);
    } else if (info.dtype === "BF16") {
      // a bfloat16 is the upper half of a float32
      const u32 = new Uint32Array(data.buffer);
      for (let i = 0; i < count; i++) u32[i] = raw.readUInt16LE(2 * i) << 16;
    } else if (info.dtype === "F16") {
      for (let i = 0; i < count; i++) data[i] = half(raw.readUInt16LE(2 * i));
    } else {
      throw new Error(`${path}: tensor ${name} has unsupported dtype ${info.dtype}`);
    }
    tensors.set(name.replace(/^transformer\./, ""), { shape: info.shape, data });
  }
  return tensors;
}

function half(bits: number): number {
  const sign = bits & 0x8000 ? -1 : 1;
  const exponent = (bits >> 10) & 0x1f;
  const fraction = bits & 0x3ff;
  if (exponent === 0) return sign * 2 ** -14 * (fraction / 1024);
  if (exponent === 31) return fraction ? NaN : sign * Infinity;
  return sign * 2 ** (exponent - 15) * (1 + fraction / 1024);
}

/** Load model.safetensors (and n_head from the config.json beside it, else n_embd / 64). */
export function loadWeights(path: string): Weights {
  const t = readSafetensors(path);
  const get = (name: string) => {
    const found = t.get(name);
    if (!found) throw new Error(`${path}: no tensor ${name}`);
    return found;
  };
  const linear = (prefix: string): Linear => {
    const w = get(`${prefix}.weight`);
    const [nIn, nOut] = w.shape;
    const weight = new Float32Array(nIn * nOut);
    for (let k = 0; k < nIn; k++) for (let j = 0; j < nOut; j++) weight[j * nIn + k] = w.data[k * nOut + j];
    return { weight, bias: get(`${prefix}.bias`).data, nIn, nOut };
  };
  const norm = (prefix: string): Norm => ({ weight: get(`${prefix}.weight`).data, bias: get(`${prefix}.bias`).data });
  const [nVocab, nEmbd] = get("wte.weight").shape;
  const layers: Layer[] = [];
  for (let i = 0; t.has(`h.${i}.ln_1.weight`); i++) {
    layers.push({
      ln1: norm(`h.${i}.ln_1`),
      cAttn: linear(`h.${i}.attn.c_attn`),
      cProj: linear(`h.${i}.attn.c_proj`),
      ln2: norm(`h.${i}.ln_2`),
      cFc: linear(`h.${i}.mlp.c_fc`),
      mlpProj: linear(`h.${i}.mlp.c_proj`),
    });
  }
  const configFile = join(dirname(path), "config.json");
  const nHead = existsSync(configFile) ? JSON.parse(readFileSync(configFile, "utf8")).n_head : nEmbd / 64;
  return { wte: get("wte.weight").data, wpe: get("wpe.weight").data, layers, lnF: norm("ln_f"), nVocab, nEmbd, nHead };
}

export function gelu(x: Float32Array): Float32Array {
  const out = new Float32Array(x.length);
  const c = Math.sqrt(2 / Math.PI);
  for (let i = 0; i < x.length; i++) {
    const t = x[i];
    out[i] = 0.5 * t * (1 + Math.tanh(c * (t + 0.044715 * t * t * t)));
  }
  return out;
}

// [n, d] -> [n, d], each row normalised to mean 0, variance 1, then scaled and shifted
export function layerNorm(x: Float32Array, n: number, p: Norm, eps = 1e-5): Float32Array {
  const width = x.length / n;
  const y = new Float32Array(x.length);
  for (let r = 0; r < n; r++) {
    const base = r * width;
    let total = 0;
    let squares = 0;
    for (let c = 0; c < width; c++) {
      total += x[base + c];
      squares += x[base + c] * x[base + c];
    }
    const mu = total / width;
    const inv = 1 / Math.sqrt(Math.max(squares / width - mu * mu, 0) + eps);
    for (let c = 0; c < width; c++) y[base + c] = p.weight[c] * ((x[base + c] - mu) * inv) + p.bias[c];
  }
  return y;
}

// a[ao..ao+len) · b[bo..bo+len), four sums at a time (JavaScript runs a loop of one sum about half as fast)
export function dot(a: Float32Array, ao: number, b: Float32Array, bo: number, len: number): number {
  let s0 = 0;
  let s1 = 0;
  let s2 = 0;
  let s3 = 0;
  let j = 0;
  for (; j + 3 < len; j += 4) {
    s0 += a[ao + j] * b[bo + j];
    s1 += a[ao + j + 1] * b[bo + j + 1];
    s2 += a[ao + j + 2] * b[bo + j + 2];
    s3 += a[ao + j + 3] * b[bo + j + 3];
  }
  for (; j < len; j++) s0 += a[ao + j] * b[bo + j];
  return s0 + s1 + (s2 + s3);
}

// [n, nIn] -> [n, nOut]
export function linear(x: Float32Array, n: number, p: Linear): Float32Array {
  const out = new Float32Array(n * p.nOut);
  for (let i = 0; i < n; i++) {
    for (let j = 0; j < p.nOut; j++) out[i * p.nOut + j] = p.bias[j] + dot(x, i * p.nIn, p.weight, j * p.nIn, p.nIn);
  }
  return out;
}

// [n] token ids at positions start.. -> [n, nEmbd]
export function embed(w: Weights, ids: number[], start = 0): Float32Array {
  const width = w.nEmbd;
  const h = new Float32Array(ids.length * width);
  for (let t = 0; t < ids.length; t++) {
    const tok = ids[t] * width;
    const pos = (start + t) * width;
    for (let c = 0; c < width; c++) h[t * width + c] = w.wte[tok + c] + w.wpe[pos + c];
  }
  return h;
}

// Heads of q [nQ, nEmbd] attending to keys and values [nK, nEmbd]; query i sits at key position nK - nQ + i.
export function attention(q: Float32Array, k: Float32Array, v: Float32Array, nQ: number, nK: number, nHead: number): Float32Array {
  const width = q.length / nQ;
  const hd = width / nHead;
  const result = new Float32Array(nQ * width);
  const weights = new Array<number>(nK);
  const acc = new Float64Array(hd);
  for (let row = 0; row < nQ; row++) {
    const last = nK - nQ + row; // the newest key this query may see
    for (let head = 0; head < nHead; head++) {
      const off = head * hd;
      let top = -Infinity;
      for (let key = 0; key <= last; key++) {
        const s = dot(q, row * width + off, k, key * width + off, hd) / Math.sqrt(hd);
        weights[key] = s;
        if (s > top) top = s;
      }
      let z = 0;
      for (let key = 0; key <= last; key++) {
        weights[key] = Math.exp(weights[key] - top);
        z += weights[key];
      }
      acc.fill(0);
      for (let key = 0; key <= last; key++) {
        const a = weights[key] / z;
        for (let c = 0; c < hd; c++) acc[c] += a * v[key * width + off + c];
      }
      for (let c = 0; c < hd; c++) result[row * width + off + c] = acc[c];
    }
  }
  return result;
}

// [n, 3 * nEmbd] -> q, k, v, each [n, nEmbd]
export function splitQkv(qkv: Float32Array, n: number): [Float32Array, Float32Array, Float32Array] {
  const d = qkv.length / n / 3;
  const parts: [Float32Array, Float32Array, Float32Array] = [new Float32Array(n * d), new Float32Array(n * d), new Float32Array(n * d)];
  for (let i = 0; i < n; i++) for (let p = 0; p < 3; p++) parts[p].set(qkv.subarray(i * 3 * d + p * d, i * 3 * d + (p + 1) * d), i * d);
  return parts;
}

export function add(a: Float32Array, b: Float32Array): Float32Array {
  return a.map((v, i) => v + b[i]);
}

export function ffn(x: Float32Array, n: number, layer: Layer): Float32Array {
  const hidden = gelu(linear(x, n, layer.cFc));
  return linear(hidden, n, layer.mlpProj);
}

// [n, nEmbd] -> [n, nEmbd]
export function mha(x: Float32Array, n: number, layer: Layer, nHead: number): Float32Array {
  const qkv = linear(x, n, layer.cAttn);
  const [queries, keys, values] = splitQkv(qkv, n);
  const mixed = attention(queries, keys, values, n, n, nHead);
  return linear(mixed, n, layer.cProj);
}

// The final layer norm's rows [n, nEmbd] -> each row's logits [nVocab] (the LM head is tied to wte)
export function logits(w: Weights, x: Float32Array, n: number): number[][] {
  const h = layerNorm(x, n, w.lnF);
  const d = w.nEmbd;
  const rows: number[][] = [];
  for (let i = 0; i < n; i++) {
    const row = new Array<number>(w.nVocab);
    for (let t = 0; t < w.nVocab; t++) row[t] = dot(h, i * d, w.wte, t * d, d);
    rows.push(row);
  }
  return rows;
}

/** [n] token ids -> [n][nVocab]: the logits at every position, by one full forward pass. */
export function forward(w: Weights, ids: number[]): number[][] {
  let h = embed(w, ids, 0);
  for (let l = 0; l < w.layers.length; l++) {
    const blk = w.layers[l];
    const a = mha(layerNorm(h, ids.length, blk.ln1), ids.length, blk, w.nHead);
    h = add(h, a);
    const m = ffn(layerNorm(h, ids.length, blk.ln2), ids.length, blk);
    h = add(h, m);
  }
  return logits(w, h, ids.length);
}

export function argmax(row: ArrayLike<number>): number {
  let best = 0;
  for (let i = 1; i < row.length; i++) if (row[i] > row[best]) best = i;
  return best;
}
