// Builds the package's WebAssembly: sluice-js for wasm32-unknown-unknown (size profile),
// then the wasm-bindgen CLI of exactly the crate's version (`--target web`: one ES module
// that Node and browsers both load), then `wasm-opt -Oz` when binaryen is installed.
// Prints the sizes. Run from anywhere: `npm run build` in sdk-js/.
import { execFileSync } from 'node:child_process';
import { readFileSync, writeFileSync, mkdirSync, statSync, renameSync } from 'node:fs';
import { gzipSync } from 'node:zlib';
import { fileURLToPath } from 'node:url';
import path from 'node:path';

const pkg = path.dirname(path.dirname(fileURLToPath(import.meta.url)));
const root = path.dirname(pkg);
const out = path.join(pkg, 'wasm');

function run(cmd, args, opts = {}) {
  console.error(`build: ${cmd} ${args.join(' ')}`);
  return execFileSync(cmd, args, { cwd: root, stdio: ['ignore', opts.capture ? 'pipe' : 'inherit', 'inherit'], encoding: 'utf8' });
}

function has(cmd) {
  try {
    execFileSync(cmd, ['--version'], { stdio: 'ignore' });
    return true;
  } catch {
    return false;
  }
}

// The version Cargo.lock resolved for the wasm-bindgen crate: the CLI must match it.
const lock = readFileSync(path.join(root, 'Cargo.lock'), 'utf8');
const pinned = /\[\[package\]\]\nname = "wasm-bindgen"\nversion = "([^"]+)"/.exec(lock)?.[1];
if (!pinned) throw new Error('Cargo.lock has no wasm-bindgen package: is sdk-js a workspace member?');
let cli = '';
try {
  cli = execFileSync('wasm-bindgen', ['--version'], { encoding: 'utf8' }).trim();
} catch {
  // reported below
}
if (cli !== `wasm-bindgen ${pinned}`) {
  console.error(
    `build: the wasm-bindgen CLI must be version ${pinned} (found: ${cli || 'none'}).\n` +
      `       Install it with: cargo install wasm-bindgen-cli --version ${pinned} --locked\n` +
      `       (bash scripts/setup does this)`,
  );
  process.exit(1);
}

run('cargo', ['build', '-p', 'sluice-js', '--target', 'wasm32-unknown-unknown', '--profile', 'wasm']);
const meta = JSON.parse(run('cargo', ['metadata', '--format-version', '1', '--no-deps'], { capture: true }));
const built = path.join(meta.target_directory, 'wasm32-unknown-unknown', 'wasm', 'sluice_js.wasm');

mkdirSync(out, { recursive: true });
run('wasm-bindgen', ['--target', 'web', '--out-dir', out, built]);

const wasm = path.join(out, 'sluice_js_bg.wasm');
const before = statSync(wasm).size;
if (has('wasm-opt')) {
  // The features rustc enables by default for wasm32 (wasm-opt must not reject them).
  const features = ['bulk-memory', 'nontrapping-float-to-int', 'sign-ext', 'mutable-globals', 'reference-types', 'multivalue'];
  const tmp = `${wasm}.opt`;
  run('wasm-opt', ['-Oz', ...features.map((f) => `--enable-${f}`), wasm, '-o', tmp]);
  renameSync(tmp, wasm);
} else {
  console.error('build: wasm-opt not found (Debian package binaryen): the module stays as rustc made it');
}
const bytes = readFileSync(wasm);
const report = {
  wasm: path.relative(pkg, wasm),
  bytes_before_wasm_opt: before,
  bytes: bytes.length,
  gzipped_bytes: gzipSync(bytes, { level: 9 }).length,
};
writeFileSync(path.join(out, 'size.json'), JSON.stringify(report, null, 2) + '\n');
console.error(`build: ${report.wasm}: ${report.bytes} bytes (${before} before wasm-opt), ${report.gzipped_bytes} gzipped`);
