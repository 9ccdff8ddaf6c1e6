"""What the book's two editions share: the second edition's build replays the rank runs (and the costly pure calls)
the first one made.

(Here, in pylib.i18n, because it is about the editions and every layer may use it: `launch` in pylib.runtime, the
planner in the torch-free pylib.analysis. It loads no torch: a tensor is fingerprinted through torch only when one
is handed in.)

The book is built twice, in English and in Chinese, from the same chapters. A chapter's rank runs compute the same
numbers in either language, so running them twice doubles half of the book's build for nothing. With
$PYLIB_LAUNCH_REPLAY naming a folder (tools/i18n/build_editions.py gives both builds one, fresh for each build), each
launch's results and printed output are stored there, and the other edition's kernel, reaching the same launch,
takes them instead of starting ranks. Without the variable (tests, labs, a reader's notebook) nothing changes.

When is it the same launch? Each kernel keeps a chain: the key of its n-th launch is a hash of the key of its
(n-1)-th, the kernel's folder, and a fingerprint of what the ranks start from —

  * the function by what it does, not where it was typed: its bytecode, constants, names, defaults and closure, the
    same for every nested function, and the value of every global it names (a notebook function's helpers and
    constants included); a library function by its module and name (the folder is fresh for each build, so
    both editions run the same library);
  * the arguments and the world size and backend by value;
  * what forked ranks inherit without being told and the chain does not pin: torch's default dtype.

Anything that cannot be fingerprinted (an open file, a lock, a generator) makes the launch run as usual. A run
whose ranks asked for the language (`pylib.i18n.language`, which every translation goes through) is stored for
that language only; one whose ranks never asked is stored for both. Only successful runs are stored; a failure is
run again. Two kernels reaching the same launch at once take turns on a lock file: the second waits and replays.

A replay lasts as long as the run did (it sleeps what is left after waiting for the other edition, so the cores
are the other edition's meanwhile): a cell that times a run shows about the same in both editions. What a replay
cannot give by itself is what the ranks did besides returning (files they wrote). A chapter whose ranks write
files that later cells or runs read works in a fresh folder of its own and names it (`working_folder(path)`, in a
hidden cell): each run's changes to the files under it are stored with its result and made again by the replay. Any
other chapter whose ranks write such files turns sharing off (`share_between_editions(False)`; without it the
replaying edition fails loudly on the missing file).

The same store serves costly pure functions of the chapter's own process (a planner search, a small training run):
`@shared` on the library function.
"""

from __future__ import annotations

import dis
import functools
import hashlib
import os
import pickle
import shutil
import sys
import time
import types
from contextlib import contextmanager
from pathlib import Path

from pylib.i18n import language, language_asked

ENV = "PYLIB_LAUNCH_REPLAY"


class Unfingerprintable(Exception):
    """A value the key cannot be computed from: the launch runs as usual."""


_GLOBAL_OPS = ("LOAD_GLOBAL", "LOAD_NAME", "STORE_GLOBAL", "DELETE_GLOBAL")
_BY_VALUE = (type(None), bool, int, float, complex, str, bytes, range, slice, type(Ellipsis))


def _code(code: types.CodeType, h, seen: dict, names: set) -> None:
    """What a code object does, without where it was written (file, line numbers): its bytecode, constants (nested
    code objects likewise), argument and variable names; the global names it reads are collected into `names`."""
    h.update(code.co_code)
    h.update(repr((code.co_argcount, code.co_kwonlyargcount, code.co_flags, code.co_varnames)).encode())
    h.update(repr((code.co_names, code.co_freevars, code.co_cellvars)).encode())
    # the globals it reads, not every name of co_names (which also holds attribute names: `pipe.chunks` would make
    # a notebook's unrelated global `chunks` part of the fingerprint, and a language-dependent one split the chain)
    names.update(i.argval for i in dis.get_instructions(code) if i.opname in _GLOBAL_OPS)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            _code(const, h, seen, names)
        else:
            _value(const, h, seen)


def _function(fn: types.FunctionType, h, seen: dict) -> None:
    module = sys.modules.get(fn.__module__ or "")
    library = module is not None and fn.__module__ != "__main__" and getattr(module, "__file__", None)
    if library and getattr(module, fn.__name__, None) is fn:
        h.update(f"function {fn.__module__}.{fn.__qualname__}".encode())
        return
    h.update(b"function by value")
    names: set[str] = set()
    _code(fn.__code__, h, seen, names)
    _value(fn.__defaults__, h, seen)
    _value(fn.__kwdefaults__, h, seen)
    for cell in fn.__closure__ or ():
        try:
            _value(cell.cell_contents, h, seen)
        except ValueError:  # an empty cell (a name bound later in the enclosing scope)
            h.update(b"empty cell")
    for name in sorted(names):  # every global the function (or a nested one) reads, by value
        if name in fn.__globals__:
            h.update(f"global {name}".encode())
            _value(fn.__globals__[name], h, seen)


def _value(obj, h, seen: dict) -> None:
    """Feed `obj`'s digest to `h`. `seen` ({id: (obj, digest or None while it is walked)}) digests an object met again
    in this walk once: the same bytes wherever it appears, so two walks that meet equal values agree whether or not
    those values are one object (one edition computes a result that shares objects with later arguments, the other
    unpickles it from the store as separate copies). Holding the object keeps its id from being reused by a
    temporary of the walk. An object met inside itself (a cycle) feeds a marker."""
    if isinstance(obj, _BY_VALUE):
        h.update(f"{type(obj).__name__}:{obj!r}".encode())
        return
    if id(obj) in seen:
        digest = seen[id(obj)][1]
        h.update(b"cycle" if digest is None else digest)
        return
    seen[id(obj)] = (obj, None)
    outer, h = h, hashlib.sha256()
    _walk(obj, h, seen)
    digest = h.digest()
    seen[id(obj)] = (obj, digest)
    outer.update(digest)


def _walk(obj, h, seen: dict) -> None:
    """What `_value` digests of an object that is not a plain value."""
    if isinstance(obj, types.ModuleType):
        h.update(f"module {obj.__name__}".encode())
    elif isinstance(obj, types.FunctionType):
        _function(obj, h, seen)
    elif isinstance(obj, (types.BuiltinFunctionType, type)):
        h.update(f"{type(obj).__name__} {getattr(obj, '__module__', None)}.{obj.__qualname__}".encode())
        if isinstance(obj, type) and obj.__module__ == "__main__":
            raise Unfingerprintable(f"class {obj.__qualname__} defined in the notebook")
    elif isinstance(obj, types.MethodType):
        _value(obj.__func__, h, seen)
        _value(obj.__self__, h, seen)
    elif isinstance(obj, (tuple, list)):
        h.update(f"{type(obj).__name__}{len(obj)}".encode())
        for item in obj:
            _value(item, h, seen)
    elif isinstance(obj, dict):
        h.update(f"dict{len(obj)}".encode())
        for key, item in obj.items():
            _value(key, h, seen)
            _value(item, h, seen)
    elif isinstance(obj, (set, frozenset)):
        h.update(f"{type(obj).__name__}{len(obj)}".encode())
        for item in sorted(_digest(v) for v in obj):
            h.update(item)
    elif _is_tensor(obj):
        t = obj.detach().cpu().contiguous()
        h.update(f"tensor {t.dtype} {tuple(t.shape)} {obj.requires_grad}".encode())
        h.update(t.view(sys.modules["torch"].uint8).numpy().tobytes() if t.numel() else b"")
    else:  # a dataclass, a config, an nn.Module...: what pickling would rebuild it from, walked as above
        try:
            reduced = obj.__reduce_ex__(pickle.HIGHEST_PROTOCOL)
        except Exception as exc:  # noqa: BLE001 - whatever pickling refuses (a lock, a file) makes it unshareable
            raise Unfingerprintable(f"{type(obj).__name__}: {exc}") from exc
        h.update(f"reduce {type(obj).__module__}.{type(obj).__qualname__}".encode())
        if isinstance(reduced, str):  # a module-level singleton, pickled by name
            h.update(reduced.encode())
            return
        _value(tuple(reduced[:3]), h, seen)  # the constructor, its arguments, the state
        for items in reduced[3:5]:  # list items, dict items
            if items is not None:
                _value(list(items), h, seen)


def _is_tensor(obj) -> bool:
    torch = sys.modules.get("torch")  # a tensor can only exist once torch is loaded
    return torch is not None and isinstance(obj, torch.Tensor)


def _digest(obj) -> bytes:
    h = hashlib.sha256()
    _value(obj, h, {})
    return h.digest()


def inherited_state() -> bytes:
    """What forked ranks inherit from the caller without being passed it and that the chain does not pin: torch's
    default dtype. (Not the generators: every process seeds torch's, Python's and numpy's from the OS, so they
    differ between the editions' kernels even where nothing else does; a chapter that seeds one does so in both
    editions alike, at the same place in the sequence, which the chain pins; one that does not gets numbers that
    change from build to build in either edition, and the replay shows one of them.)"""
    torch = sys.modules.get("torch")
    return hashlib.sha256(str(torch.get_default_dtype() if torch else None).encode()).digest()


def fingerprint(fn, args: tuple, kwargs: dict, world_size: int, backend: str) -> bytes:
    """The launch's fingerprint (raises Unfingerprintable)."""
    h = hashlib.sha256()
    h.update(f"{world_size} {backend}".encode())
    seen: dict = {}
    _value(fn, h, seen)
    _value(args, h, seen)
    _value(kwargs, h, seen)
    h.update(inherited_state())
    return h.digest()


_shared = True  # share_between_editions(False) turns it off for this process
_working: Path | None = None  # `working_folder`: whose file changes are part of a run's outcome
_chain = b""  # the key of this process's last shared run
_inside = False  # a shared run is under way in this process


def share_between_editions(on: bool = True) -> None:
    """Whether this process's launches from here on are stored for (and taken from) the other edition's build
    (only ever when $PYLIB_LAUNCH_REPLAY names a folder)."""
    global _shared
    _shared = bool(on)


def working_folder(path) -> None:
    """Make `path`, the working folder a chapter has just moved into (a fresh temporary folder, as the checkpoints
    chapter's), part of what its shared runs store and replays give back: the files a run writes, changes or removes
    under it are kept with its result, and a replay makes the same changes in the replaying edition's own folder, so
    the cells and runs after it read the same files in both editions. The chain then names the folder by this role,
    not by its path (each edition's mkdtemp has another name). None: back to plain runs."""
    global _working
    _working = None if path is None else Path(path).resolve()


def _files(root: Path) -> dict[str, tuple[int, int] | None]:
    """{path relative to `root`: (size, mtime in ns) for a file, None for a folder} of everything under it."""
    out: dict[str, tuple[int, int] | None] = {}
    for base, dirs, names in os.walk(root):
        for name in dirs:
            out[os.path.relpath(os.path.join(base, name), root)] = None
        for name in names:
            st = os.stat(os.path.join(base, name))
            out[os.path.relpath(os.path.join(base, name), root)] = (st.st_size, st.st_mtime_ns)
    return out


def _changes(root: Path, before: dict) -> tuple[dict[str, bytes | None], list[str]]:
    """({file written or changed since `before`: its bytes, folder made since: None}, [what was removed since]): a
    save that writes into a temporary folder and renames it leaves a new folder and removes the old one."""
    after = _files(root)
    made = {
        rel: None if stat is None else (root / rel).read_bytes()
        for rel, stat in after.items()
        if rel not in before or before[rel] != stat
    }
    return made, sorted(set(before) - set(after))


def _make_changes(root: Path, changes) -> None:
    made, removed = changes
    for rel in sorted(removed, key=lambda r: -r.count(os.sep)):  # what a folder held before the folder itself
        path = root / rel
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink(missing_ok=True)
    for rel, data in sorted(made.items()):  # a folder before what it holds
        if data is None:
            (root / rel).mkdir(parents=True, exist_ok=True)
        else:
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            (root / rel).write_bytes(data)


def _place() -> str:
    """Where this run is, for the chain: the working directory, or the role of a `working_folder` (above)."""
    cwd = Path.cwd().resolve()
    return "(the working folder)" if _working is not None and cwd == _working else str(cwd)


def folder() -> Path | None:
    raw = os.environ.get(ENV)
    return Path(raw) if raw and _shared else None


class Slot:
    """One run's place in the store: `get()` returns what was stored for this language or for any language, else
    None; `put(...)` stores a finished run with the seconds it took."""

    def __init__(self, root: Path, key: str, waited_since: float):
        self.root, self.key, self.waited_since = root, key, waited_since
        self.working = _working  # the working folder's files as they were before the run (`working_folder`)
        self.before = _files(_working) if _working is not None else None

    def _path(self, tag: str) -> Path:
        return self.root / f"{self.key}-{tag}.pkl"

    def get(self):
        """The stored value, after sleeping out what is left of the seconds the run took (the time spent waiting for
        the other edition to finish it counts): a cell that times it shows what the run took, and the other edition
        has the cores meanwhile."""
        for tag in ("any", language()):
            path = self._path(tag)
            if path.exists():
                with open(path, "rb") as f:
                    value, seconds, changes = pickle.load(f)
                if changes is not None and self.working is not None:
                    _make_changes(self.working, changes)
                (self.root / f"{self.key}.replayed").touch()  # the build counts them
                time.sleep(max(0.0, seconds - (time.monotonic() - self.waited_since)))
                return value
        return None

    def put(self, value, seconds: float, asked_language: bool) -> None:
        path = self._path(language() if asked_language else "any")
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        try:
            changes = _changes(self.working, self.before) if self.working is not None else None
            data = pickle.dumps((value, seconds, changes), protocol=pickle.HIGHEST_PROTOCOL)
        except Exception:  # noqa: BLE001 - a value pickle refuses (a lambda in a result) is simply not shared
            return
        tmp.write_bytes(data)
        os.replace(tmp, path)


@contextmanager
def slot(fn, args: tuple, kwargs: dict, world_size: int, backend: str):
    """The store's slot for this run, held under its lock (None when sharing is off or the run cannot be
    fingerprinted); the chain moves on either way, so the next run's key names its place after this one."""
    global _chain, _inside
    root = folder()
    if root is None or _inside:  # inside a shared run, what it calls is part of it (the replay never calls it)
        yield None
        return
    try:
        fp = fingerprint(fn, args, kwargs, world_size, backend)
    except Unfingerprintable:
        _chain = hashlib.sha256(_chain + b"unfingerprintable").digest()
        yield None
        return
    _chain = hashlib.sha256(_chain + _place().encode() + fp).digest()
    root.mkdir(parents=True, exist_ok=True)
    key = _chain.hex()[:32]
    with open(root / "runs.log", "a") as log:  # who ran what, for finding where two editions' chains part
        name = getattr(fn, "__qualname__", type(fn).__name__)
        log.write(f"{os.environ.get('PYLIB_LANG', 'en')} {os.getpid()} {name} {fp.hex()[:12]} {key}\n")
    waited_since = time.monotonic()
    import fcntl  # here, not at the top: the live explorers' browser bundle imports this module and never gets here

    with open(root / f"{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # the other edition, if it is running this launch, finishes first
        _inside = True
        try:
            yield Slot(root, key, waited_since)
        finally:
            _inside = False
            fcntl.flock(lock, fcntl.LOCK_UN)


def shared(fn):
    """Decorate a pure library function whose calls are costly (a planner search, a training run in this process):
    under the book's build its result is shared between the editions as a launch's is. Pure: what it returns depends
    only on its arguments, and it changes neither them nor anything else the chapter reads later (torch's generator,
    which a seeded run moves, is put back after every call in both editions). A call that asked for the language is
    kept for that language only."""

    @functools.wraps(fn)
    def call(*args, **kwargs):
        with slot(call, args, kwargs, 0, "this process") as stored:  # by name: the decorated function
            earlier = stored.get() if stored is not None else None
            if earlier is not None:
                return earlier
            asked, start = language_asked(), time.monotonic()
            torch = sys.modules.get("torch")
            generator = torch.random.get_rng_state() if torch else None
            try:
                value = fn(*args, **kwargs)
            finally:  # what the replay cannot redo, the run does not do either: leave torch's generator as it was
                if torch:
                    torch.random.set_rng_state(generator)
            if stored is not None:
                stored.put(value, time.monotonic() - start, language_asked() != asked)
            return value

    return call
