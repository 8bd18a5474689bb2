#!/usr/bin/env node
// Run Python files under real MicroPython (the WebAssembly port from npm) on Node.js.
//
//   node tests/micropython/run.mjs [OPTIONS] [FILE.py ...]
//
// All FILE.py arguments are executed in order as `__main__` in ONE interpreter, so a
// later file sees the globals left by an earlier one.  Every FILE.py (and every
// --lib FILE.py) is also written into MicroPython's virtual filesystem as
// /lib/<basename>, which is on MicroPython's sys.path, so `import <stem>` works.
// A file given as `-` is read from standard input and runs as "<stdin>".
//
// Options:
//   --lib FILE.py        make FILE.py importable as <stem> without running it (repeatable)
//   -c CODE              run CODE as `__main__` after the files (repeatable, in order)
//   --heapsize BYTES     MicroPython GC heap size; k/m suffixes allowed (default 16m)
//   --pystack WORDS      MicroPython pystack size in words (default 16384)
//   --                   end of options
//
// MicroPython's stdout/stderr are streamed to Node's stdout/stderr.  Exit status:
//   0    every file ran to completion (or raised SystemExit with code 0 / None)
//   1    the Python code raised; MicroPython's traceback is printed to stderr
//   N    SystemExit(N) for an integer N
//   2    usage error or a failure of the harness itself (missing file, wasm abort)
//
// Options may also be written --lib=FILE, --heapsize=N, --pystack=N.

import { readFileSync } from "node:fs";
import { basename } from "node:path";

const PACKAGE = "@micropython/micropython-webassembly-pyscript";
const USAGE =
  "usage: node run.mjs [--lib FILE.py]... [-c CODE]... [--heapsize BYTES] [--pystack WORDS]" +
  " [--] [FILE.py ...]";

class UsageError extends Error {}

function parseSize(text, option) {
  const match = /^(\d+)([kKmM]?)$/.exec(text ?? "");
  if (!match) throw new UsageError(`${option}: expected a positive integer (k/m suffix allowed), got ${JSON.stringify(text)}`);
  const scale = { "": 1, k: 1024, m: 1024 * 1024 }[match[2].toLowerCase()];
  const value = Number(match[1]) * scale;
  if (!(value > 0)) throw new UsageError(`${option} must be positive`);
  return value;
}

function parseArgs(argv) {
  const opts = { libs: [], steps: [], heapsize: 16 * 1024 * 1024, pystack: 16 * 1024 };
  let onlyFiles = false;
  for (let i = 0; i < argv.length; i++) {
    const arg = argv[i];
    if (onlyFiles || arg === "-" || !arg.startsWith("-")) {
      opts.steps.push({ kind: "file", path: arg });
      continue;
    }
    if (arg === "--") {
      onlyFiles = true;
      continue;
    }
    if (arg === "-h" || arg === "--help") {
      process.stdout.write(USAGE + "\n");
      process.exit(0);
    }
    const eq = arg.indexOf("=");
    const name = arg.startsWith("--") && eq > 0 ? arg.slice(0, eq) : arg;
    const takeValue = () => {
      if (arg.startsWith("--") && eq > 0) return arg.slice(eq + 1);
      if (i + 1 >= argv.length) throw new UsageError(`${name} needs a value`);
      return argv[++i];
    };
    switch (name) {
      case "--lib":
        opts.libs.push(takeValue());
        break;
      case "-c":
        opts.steps.push({ kind: "code", code: takeValue() });
        break;
      case "--heapsize":
        opts.heapsize = parseSize(takeValue(), name);
        break;
      case "--pystack":
        opts.pystack = parseSize(takeValue(), name);
        break;
      default:
        throw new UsageError(`unknown option ${arg}`);
    }
  }
  if (opts.steps.length === 0) throw new UsageError("nothing to run: give FILE.py, - or -c CODE");
  return opts;
}

// Byte sink that forwards MicroPython's output (delivered one byte at a time) to a Node stream
// in chunks: flushed at each newline, when the buffer fills, and before the process ends.
function makeSink(stream) {
  const buf = new Uint8Array(8192);
  let len = 0;
  const flush = () => {
    if (len > 0) {
      stream.write(buf.slice(0, len));
      len = 0;
    }
  };
  const put = (bytes) => {
    for (const b of bytes) {
      buf[len++] = b;
      if (b === 10 || len === buf.length) flush();
    }
  };
  return { put, flush };
}

function readSource(path) {
  try {
    return readFileSync(path === "-" ? 0 : path, "utf8");
  } catch (error) {
    throw new UsageError(`cannot read ${path === "-" ? "standard input" : path}: ${error.message}`);
  }
}

// Python string literal for an arbitrary JS string (JSON escapes are valid Python escapes, but
// JSON leaves U+2028/9 raw, which Python accepts; non-ASCII stays UTF-8 which MicroPython reads).
const pyStr = (s) => JSON.stringify(s);

// Maps a SystemExit traceback's last line to an exit status, like CPython does.
function systemExitStatus(message, stderr) {
  const lines = message.trimEnd().split("\n");
  const last = lines[lines.length - 1];
  const arg = last.replace(/^SystemExit:?\s*/, "");
  if (arg === "" || arg === "None") return 0;
  if (/^-?\d+$/.test(arg)) return Number(arg) & 0xff;
  stderr.put(new TextEncoder().encode(arg + "\n"));
  return 1;
}

async function main() {
  let opts;
  try {
    opts = parseArgs(process.argv.slice(2));
  } catch (error) {
    if (!(error instanceof UsageError)) throw error;
    process.stderr.write(`run.mjs: ${error.message}\n${USAGE}\n`);
    return 2;
  }

  // Read every input before starting the interpreter, so a missing file is a usage error.
  let libs, steps;
  try {
    libs = opts.libs.map((path) => ({ path, source: readSource(path) }));
    steps = opts.steps.map((step) =>
      step.kind === "code" ? step : { ...step, source: readSource(step.path) },
    );
  } catch (error) {
    if (!(error instanceof UsageError)) throw error;
    process.stderr.write(`run.mjs: ${error.message}\n`);
    return 2;
  }

  let loadMicroPython;
  try {
    ({ loadMicroPython } = await import(PACKAGE));
  } catch (error) {
    process.stderr.write(
      `run.mjs: cannot load ${PACKAGE} (${error.message}).\n` +
        "Install it with: npm ci --prefix tests/micropython --no-audit --no-fund\n",
    );
    return 2;
  }

  const stdout = makeSink(process.stdout);
  const stderr = makeSink(process.stderr);
  const mp = await loadMicroPython({
    heapsize: opts.heapsize,
    pystack: opts.pystack,
    linebuffer: false,
    stdout: (bytes) => stdout.put(bytes),
    stderr: (bytes) => stderr.put(bytes),
  });

  // Importable modules live in /lib (on MicroPython's default sys.path: '', '.frozen', '/lib').
  // Scripts run from /run/<n>/<basename> so tracebacks show their real file name.
  mp.FS.mkdirTree("/lib");
  const install = (path, source) => {
    if (path === "-") return;
    mp.FS.writeFile(`/lib/${basename(path)}`, source);
  };
  for (const lib of libs) install(lib.path, lib.source);
  for (const step of steps) if (step.kind === "file") install(step.path, step.source);

  let status = 0;
  try {
    for (const [index, step] of steps.entries()) {
      if (step.kind === "code" || step.path === "-") {
        // Runs in __main__'s globals; tracebacks name the code "<stdin>".
        mp.runPython(step.kind === "code" ? step.code : step.source);
      } else {
        const vfsPath = `/run/${index}/${basename(step.path)}`;
        mp.FS.mkdirTree(`/run/${index}`);
        mp.FS.writeFile(vfsPath, step.source);
        // exec() without a globals argument runs in __main__'s globals, which all steps share.
        mp.runPython(
          `__file__ = ${pyStr(step.path)}\n` +
            `exec(compile(open(${pyStr(vfsPath)}).read(), ${pyStr(step.path)}, "exec"))`,
        );
      }
      stdout.flush();
      stderr.flush();
    }
  } catch (error) {
    stdout.flush();
    if (error?.name !== "PythonError") {
      stderr.flush();
      process.stderr.write(`run.mjs: MicroPython harness failure: ${error?.stack ?? error}\n`);
      return 2;
    }
    if (error.type === "SystemExit") {
      status = systemExitStatus(error.message, stderr);
    } else {
      stderr.put(new TextEncoder().encode(error.message.endsWith("\n") ? error.message : error.message + "\n"));
      status = 1;
    }
  }
  stdout.flush();
  stderr.flush();
  return status;
}

try {
  process.exitCode = await main();
} catch (error) {
  process.stderr.write(`run.mjs: MicroPython harness failure: ${error?.stack ?? error}\n`);
  process.exitCode = 2;
}
