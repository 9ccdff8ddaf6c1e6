"""Vendor the site's JavaScript from the npm registry, so the built book needs no other host.

Run by `make vendor` (a prerequisite of `make book`); a no-op when the pinned versions are already in place. It
`npm pack`s each pinned package (npm checks the tarball against the registry's integrity hash; this script then
checks it against the hash pinned below, so a re-published version cannot slip in), and extracts the needed files
into book/_static/vendor/<name>/ (git-ignored). _config.yml serves them from there:

- MathJax 3 (`mathjax_path: vendor/mathjax/tex-mml-chtml.js`), with its fonts and lazily loaded extensions beside it;
- require.js and the Jupyter widget manager's embed bundle (`nb_ipywidgets_js`), which renders the widget state
  saved in an executed notebook, with the fonts its CSS points to;
- Pyodide, which the static explorers (`pylib.viz.live`, book/_static/live-explorer.js) load to run pylib in the
  page.

Not `_static/` at the book root: Jupyter Book 1 adds every .js/.css under the static paths to every page when a
root `_static/` exists, and would add these hundreds of files (twice). Only the files named in _config.yml load.

    python tools/site/vendor.py [--dest book/_static/vendor] [--force]
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import shutil
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DEST = ROOT / "book" / "_static" / "vendor"
STAMP_NAME = ".vendored.json"  # a dotfile: Sphinx does not copy it into the site


@dataclass(frozen=True)
class Package:
    """One npm package: which files of its tarball (paths under `package/`) go to `vendor/<dest>/`."""

    name: str
    version: str
    integrity: str  # the registry's sha512, as `npm view NAME@VERSION dist.integrity` prints it
    dest: str
    source: str  # folder (ending in "/"; "" for the whole package) or file inside the tarball's package/
    skip: tuple[str, ...] = ()  # leave out the tarball's files whose path contains one of these


PACKAGES = (
    # MathJax 3, as Sphinx 7 configures it (mathjax3_config). The whole es5/ folder: the combined component loads
    # its fonts (output/chtml/fonts/woff-v2), TeX extensions (input/tex/extensions) and the menu's accessibility
    # parts (a11y/, sre/) lazily, from paths relative to itself.
    Package(
        "mathjax",
        "3.2.2",
        "sha512-Bt+SSVU8eBG27zChVewOicYs7Xsdt40qm4+UpHyX7k0/O9NliPc+x77k1/FEsPsjKPZGJvtRZM1vO+geW0OhGw==",
        dest="mathjax",
        source="es5/",
        skip=("svg", "node-main.js"),  # the SVG output and the Node entry point: the site uses CommonHTML
    ),
    # The AMD loader the widget embed bundle needs (`define`/`require` on the page).
    Package(
        "requirejs",
        "2.3.8",
        "sha512-7/cTSLOdYkNBNJcDMWf+luFvMriVm7eYxp4BcFCsAX0wF421Vyce5SXP17c+Jd5otXKGNehIonFlyQXSowL6Mw==",
        dest="requirejs",
        source="require.js",
    ),
    # The widget manager for static pages (ipywidgets 8; it also renders ipywidgets 7 state). embed-amd.js bundles
    # @jupyter-widgets/base and controls (the manager itself provides output); its Font Awesome CSS loads the font
    # files beside it. The other bundles (embed.js for non-AMD pages, libembed-amd.js) and source maps are unused.
    Package(
        "@jupyter-widgets/html-manager",
        "1.0.15",
        "sha512-5thBIV6ymNgmPVOHvzx+gGy8ZSKmSazhtGw4/c4xJDVzRhG9PTeQsRjF3FUTopvFi//SABeNz1yp47bCrJ3CQA==",
        dest="html-manager",
        source="dist/",
        skip=(".map", ".LICENSE.txt", "dist/embed.js", "dist/libembed-amd.js"),
    ),
    # Pyodide (CPython in WebAssembly, with its standard library): the static explorers of pylib.viz.live run
    # pylib's own torch-free analysis in the page with it, loaded only when a reader first moves a control. The ES
    # module entry point, the runtime, the standard library and the lock file loadPyodide reads at start; not the
    # UMD build (pyodide.js: require.js on the widget pages would take it as an AMD module), the consoles, types
    # and source maps.
    Package(
        "pyodide",
        "314.0.8",
        "sha512-74Wq1kXOC+CCEzAfxuRAO701nAcCMLjf8NrwvWpu8S41dVMXwXmLQ05dYB+F4e46AdnGo0oq7YHSVUpHsoarLQ==",
        dest="pyodide",
        source="",
        skip=(".map", ".d.ts", "console", "package/pyodide.js", "README", "package.json"),
    ),
)


def _sri_sha512(path: Path) -> str:
    return "sha512-" + base64.b64encode(hashlib.sha512(path.read_bytes()).digest()).decode()


def _manifest() -> list[dict]:
    """The pinned packages as the stamp records them (through JSON, so tuples compare as the lists read back)."""
    return json.loads(json.dumps([asdict(p) for p in PACKAGES]))


def is_current(dest: Path) -> bool:
    """True when `dest` holds exactly the pinned packages (its stamp matches and every folder is there)."""
    stamp = dest / STAMP_NAME
    if not stamp.is_file():
        return False
    try:
        recorded = json.loads(stamp.read_text())
    except json.JSONDecodeError:
        return False
    return recorded == _manifest() and all((dest / p.dest).exists() for p in PACKAGES)


def _pack_all(workdir: Path) -> dict[str, Path]:
    """`npm pack` every pinned package into `workdir` (one npm call); return {name: tarball}, each checked against
    its pinned sha512."""
    specs = [f"{p.name}@{p.version}" for p in PACKAGES]
    out = subprocess.run(
        ["npm", "pack", "--json", "--pack-destination", str(workdir), *specs],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    tarballs = {info["name"]: workdir / info["filename"] for info in json.loads(out)}
    for pkg in PACKAGES:
        actual = _sri_sha512(tarballs[pkg.name])
        if actual != pkg.integrity:
            raise SystemExit(f"{pkg.name}@{pkg.version}: tarball sha512 {actual} is not the pinned {pkg.integrity}")
    return tarballs


def _extract(pkg: Package, tarball: Path, target: Path) -> int:
    """Extract pkg.source from the tarball into target; return the number of files written."""
    prefix = "package/" + pkg.source
    count = 0
    with tarfile.open(tarball, "r:gz") as tar:
        for member in tar.getmembers():
            if not member.isfile() or not member.name.startswith(prefix):
                continue
            if any(part in member.name for part in pkg.skip):
                continue
            rel = member.name[len(prefix) :] if not pkg.source or pkg.source.endswith("/") else Path(pkg.source).name
            out = target / rel
            if ".." in Path(rel).parts or out.resolve() != out.absolute().resolve():
                raise SystemExit(f"{pkg.name}: refusing the tarball path {member.name!r}")
            out.parent.mkdir(parents=True, exist_ok=True)
            with tar.extractfile(member) as src, open(out, "wb") as dst:
                shutil.copyfileobj(src, dst)
            count += 1
    if count == 0:
        raise SystemExit(f"{pkg.name}@{pkg.version}: no file under package/{pkg.source} in the tarball")
    return count


def vendor(dest: Path = DEST, force: bool = False) -> bool:
    """Bring `dest` to the pinned packages. Returns False when it already was (nothing done)."""
    if not force and is_current(dest):
        (dest / STAMP_NAME).touch()  # so make sees the stamp newer than this script and skips the step next time
        return False
    if shutil.which("npm") is None:
        raise SystemExit("npm is needed to vendor MathJax and the widget manager (apt-get install npm)")
    # A dotted sibling: Sphinx copies no dotfile into the site, and the next run removes one left by an interruption.
    staging = dest.with_name(f".{dest.name}.staging")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    with tempfile.TemporaryDirectory() as tmp:
        tarballs = _pack_all(Path(tmp))
        for pkg in PACKAGES:
            n = _extract(pkg, tarballs[pkg.name], staging / pkg.dest)
            print(f"vendored {pkg.name}@{pkg.version}: {n} files -> {dest.relative_to(ROOT)}/{pkg.dest}")
    (staging / STAMP_NAME).write_text(json.dumps(_manifest(), indent=1) + "\n")
    shutil.rmtree(dest, ignore_errors=True)
    staging.rename(dest)
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dest", type=Path, default=DEST)
    parser.add_argument("--force", action="store_true", help="vendor again even when the pinned versions are there")
    args = parser.parse_args(argv)
    if not vendor(args.dest.resolve(), args.force):
        print(f"{args.dest}: pinned site JavaScript already vendored")
    return 0


if __name__ == "__main__":
    sys.exit(main())
