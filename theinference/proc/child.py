"""The student's side of the runner: runs in its own process, imports tests/adapters.py, calls it.

Started by theinference.proc.runner as `python -m theinference.proc.child JOB.json`. It reports to the
grader through a pipe (fd in THEINFERENCE_PROTOCOL_FD), one JSON object a line, and writes each
returned array to OUT_DIR/case-<i>.npy. Nothing here imports numpy before the student does,
except to save results.
"""

import errno
import importlib.abc
import importlib.util
import json
import os

try:
    import resource
except ImportError:  # no rlimits (Windows): each cap set below is skipped there. What bounds the adapter's processes
    # then is the grader: its watch over their tree's memory (accounting.TreeMemory) and each case's timeout.
    resource = None  # type: ignore[assignment]
import sys
import time
import traceback
from pathlib import Path

if __name__ == "__main__":
    # Run as a script (the sandbox's copy), the package beside this file is the one students import,
    # and the one this file's own import below must find.
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from theinference.proc import protocol, seal  # noqa: E402 - after the path is set, for the sandbox's copy
from theinference.sizes import size_text  # noqa: E402 - the same

_GRADER_DIR = str(Path(__file__).resolve().parents[1])


def _send(stream, **message) -> None:
    stream.write(json.dumps(message) + "\n")
    stream.flush()


def _output_offsets() -> list[int]:
    """Where the student's stdout and stderr files stand now: each case's output is a slice."""
    sys.stdout.flush()
    sys.stderr.flush()
    return [os.lseek(1, 0, os.SEEK_CUR), os.lseek(2, 0, os.SEEK_CUR)]


def _student_traceback(exc: BaseException) -> str:
    """The traceback without the grader's own frames: the student sees only their code."""
    te = traceback.TracebackException.from_exception(exc)
    te.stack = traceback.StackSummary.from_list(
        [f for f in te.stack if not f.filename.startswith(_GRADER_DIR) and "importlib._bootstrap" not in f.filename]
    )
    return "".join(te.format())


def _import_adapters(path: Path):
    spec = importlib.util.spec_from_file_location("adapters", path)
    assert spec is not None and spec.loader is not None, "a .py path always has a loader"
    module = importlib.util.module_from_spec(spec)
    sys.modules["adapters"] = module
    spec.loader.exec_module(module)
    return module


def _find_function(module, names: list[str]):
    for name in names:
        func = getattr(module, name, None)
        if callable(func):
            return func
    return None


def _load(job: protocol.Job, proto):
    """Import the adapters and find the function; report a load error and return None on failure."""
    path = Path(job["adapters"])
    try:
        module = _import_adapters(path)
    except SyntaxError as e:
        _send(
            proto,
            event=protocol.LOAD_ERROR,
            kind="syntax",
            message=f"syntax error in {e.filename}, line {e.lineno}",
            traceback="".join(traceback.format_exception_only(e)),
        )
        return None
    except BaseException as e:  # noqa: BLE001 - anything the student's import does is reported
        _send(
            proto,
            event=protocol.LOAD_ERROR,
            kind="import",
            message=f"importing {path.name} failed: {type(e).__name__}: {e}",
            traceback=_student_traceback(e),
        )
        return None
    func = _find_function(module, job["names"])
    if func is None:
        expected, aliases = job["names"][0], ", ".join(job["names"][1:])
        also = f" (also accepted: {aliases})" if aliases else ""
        _send(
            proto,
            event=protocol.LOAD_ERROR,
            kind="missing",
            message=f"{path.name} defines no function '{expected}'{also}",
        )
    return func


def _to_array(value):
    """Accept any array-like of numbers; return (array, None) or (None, why not)."""
    import numpy as np

    try:
        array = np.asarray(value)
    except Exception as e:  # ragged nested lists and the like
        return None, f"the return value is not an array of numbers ({type(e).__name__}: {e})"
    if array.dtype.kind not in "biuf":
        return None, f"the return value is not numeric (got {type(value).__name__} of dtype {array.dtype})"
    return array, None


def _run_case(func, index: int, args: list, out_dir: Path, proto) -> None:
    import numpy as np

    def done(**message):
        _send(proto, event=protocol.DONE, case=index, output=_output_offsets(), **message)

    _send(proto, event=protocol.START, case=index, output=_output_offsets())
    started = time.perf_counter()
    try:
        value = func(*args)
    except NotImplementedError as e:
        done(status=protocol.NOT_STARTED, message=f"NotImplementedError: {e}" if str(e) else "NotImplementedError")
        return
    except SystemExit as e:
        done(status=protocol.ERROR, message=f"the adapter called sys.exit({e.code!r})", traceback=_student_traceback(e))
        return
    except MemoryError as e:
        done(
            status=protocol.ERROR,
            message=f"out of memory: the adapter exceeded its memory limit (MemoryError: {e})",
            traceback=_student_traceback(e),
        )
        return
    except BaseException as e:  # noqa: BLE001 - the student's exception is the result
        done(status=protocol.ERROR, message=_error_message(e), traceback=_student_traceback(e))
        return
    seconds = time.perf_counter() - started
    array, problem = _to_array(value)
    if problem:
        done(status=protocol.BAD_OUTPUT, message=problem, seconds=seconds)
        return
    out = out_dir / f"case-{index}.npy"
    cap = _file_cap()
    if cap is not None and array.nbytes + _NPY_HEADER > cap:  # not even begun: the quota stays free
        done(status=protocol.ERROR, message=_save_problem(OSError(errno.EFBIG, "too large"), array), seconds=seconds)
        return
    try:
        np.save(out, array, allow_pickle=False)
    except OSError as e:  # CPython ignores SIGXFSZ: a write over the file cap raises EFBIG here instead
        out.unlink(missing_ok=True)
        done(status=protocol.ERROR, message=_save_problem(e, array), seconds=seconds)
        return
    done(status=protocol.OK, file=str(out), seconds=seconds)


_NPY_HEADER = 4096  # at least what a .npy header takes
_FULL = (errno.ENOSPC, errno.EFBIG, getattr(errno, "EDQUOT", errno.ENOSPC))


def _file_cap() -> int | None:
    """The size cap on files this process writes (RLIMIT_FSIZE), None if it has none."""
    if resource is None:
        return None
    cap = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
    return None if cap == resource.RLIM_INFINITY else cap


def _error_message(error: BaseException) -> str:
    """The student's exception in a line; a write refused for the run directory's quota says so (the grader's own
    measurement of that directory decides the verdict when it sees it; this is the hint when the student's process
    ended the case first)."""
    text = f"{type(error).__name__}: {error}"
    cap = _file_cap()
    if isinstance(error, OSError) and error.errno in _FULL and cap is not None:
        text += f" (the adapter's processes may write at most {size_text(cap)} to their run directory, $TMPDIR, in all)"
    if isinstance(error, OSError) and error.errno == errno.EAGAIN and _tasks_capped:
        text += f" (the adapter may start at most {MAX_PROCESSES} processes and threads)"
    return text


def _save_problem(error: OSError, array) -> str:
    """Why the returned array could not be handed over, in the student's terms (no grader frames)."""
    cap = _file_cap()
    # numpy's writer may report the short write without an errno: the array's size tells.
    if error.errno == errno.EFBIG or (cap is not None and array.nbytes >= cap):
        limit = "the file size limit" if cap is None else size_text(cap)
        return (
            f"the adapter's output exceeded {limit} (it returned {size_text(array.nbytes)}, "
            f"shape {list(array.shape)}, {array.dtype})"
        )
    return f"the adapter's output could not be saved: {error}"


class _OracleGuard(importlib.abc.MetaPathFinder):
    """Refuse the grader's own modules: an adapter must compute, not copy the oracle.

    This stops casual copying; it is not a sandbox (student code runs with the user's rights).
    """

    def find_spec(self, name, path=None, target=None):
        if name.startswith("theinference.") and name != "theinference.proc.child":
            raise ImportError(f"adapters may not use the grader's oracle ({name} cannot be imported by graded code)")
        return None


def _guard_grader_modules() -> None:
    for name in [m for m in sys.modules if m.startswith("theinference.") and m != "theinference.proc.child"]:
        del sys.modules[name]
    sys.meta_path.insert(0, _OracleGuard())


def _apply_limits(limits: protocol.Limits) -> None:
    """Cap the address space and the size of files written (the captured output included).

    The hard limit is lowered too: with only the soft one set, student code could raise it back.
    """
    if resource is None:
        return
    for wanted, which in ((limits["memory_bytes"], resource.RLIMIT_AS), (limits["file_bytes"], resource.RLIMIT_FSIZE)):
        if wanted:
            _, hard = resource.getrlimit(which)
            cap = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
            resource.setrlimit(which, (cap, cap))


MAX_PROCESSES = 256  # processes (threads included) a submission's uid may have at once
_tasks_capped = False  # whether this process set that cap (RLIMIT_NPROC): a fork refused is then the cap's


def _tasks_of(uid: int) -> int:
    """Tasks (processes and threads) whose real uid is uid, as RLIMIT_NPROC counts them."""
    total = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/status", "rb") as f:
                fields = dict(line.split(b":", 1) for line in f.read().splitlines() if b":" in line)
            if int(fields[b"Uid"].split()[0]) == uid:
                total += int(fields[b"Threads"])
        except (OSError, KeyError, ValueError, IndexError):
            pass
    return total


def _in_user_namespace() -> bool:
    """Whether this process runs in a user namespace other than the machine's (its uid 0 is not root there)."""
    try:
        with open("/proc/self/uid_map", "rb") as f:
            return f.read().split() != [b"0", b"0", b"4294967295"]
    except OSError:
        return False


def _cap_tasks() -> None:
    """Running as the grader's own user (limits' shares_uid): at most MAX_PROCESSES tasks more than that user runs now.

    Nothing else bounds a fork bomb there (no uid, namespace or cgroup of its own): it would take every pid of the
    machine, the grader's next process included, and outrun its own killing. Root is exempt from the cap, but not
    the root of a user namespace a non-root grader made (unshare --user): the kernel counts and caps its tasks."""
    if sys.platform != "linux" or resource is None or (os.getuid() == 0 and not _in_user_namespace()):
        return
    cap = _tasks_of(os.getuid()) + MAX_PROCESSES
    _, hard = resource.getrlimit(resource.RLIMIT_NPROC)
    cap = cap if hard == resource.RLIM_INFINITY else min(cap, hard)
    resource.setrlimit(resource.RLIMIT_NPROC, (cap, cap))
    global _tasks_capped
    _tasks_capped = True


def _drop_privileges() -> None:
    """As root, become the unprivileged user the launcher names, before any student code runs."""
    run_as = os.environ.pop("THEINFERENCE_RUN_AS", None)
    if run_as:
        # The uid is this submission's alone (launch.SubprocessLauncher._uid_for), so a cap on its processes is a cap
        # on the submission's tree: the fallback where no cgroup sets pids.max (root is exempt, hence after setuid).
        resource.setrlimit(resource.RLIMIT_NPROC, (MAX_PROCESSES, MAX_PROCESSES))
        global _tasks_capped
        _tasks_capped = True
        os.setgroups([])
        os.setgid(int(run_as))
        os.setuid(int(run_as))


def _await_go() -> None:
    """Started without fork (the monitor's popen_held): wait until the monitor has reported this process's pid, so
    that student code which kills its monitor at once still leaves the grader knowing whose tree to kill. The hold's
    end closing without the byte means the monitor is gone: nothing runs."""
    token = os.environ.pop(protocol.GO_FD_ENV, None)
    if token is None:
        return  # forked and held by the monitor itself (reaper.fork_held), or run by hand
    fd = protocol.inherited(token, os.O_RDONLY)
    try:
        go = os.read(fd, 1)
    finally:
        os.close(fd)
    if go != b"1":
        os._exit(1)


def main() -> None:
    _await_go()
    _drop_privileges()
    job: protocol.Job = json.loads(Path(sys.argv[1]).read_text())
    fd = protocol.inherited(os.environ.pop(protocol.PROTOCOL_FD_ENV), os.O_WRONLY)
    os.set_inheritable(fd, False)  # processes the student starts do not get the grader's pipe
    proto = os.fdopen(fd, "w")
    _apply_limits(job["limits"])
    if job["limits"].get("shares_uid"):
        _cap_tasks()
    _guard_grader_modules()
    if job["limits"].get("seal"):
        seal.seal()  # where it cannot, the grader sees no seal (seal.tree_sealed) and counts the tree as it is
    sys.path.insert(0, job["course_root"])
    func = _load(job, proto)
    if func is None:
        return
    code = getattr(func, "__code__", None)  # where the function the module exports was written (for annotations)
    _send(proto, event=protocol.LOADED, **({"defined_at": [code.co_filename, code.co_firstlineno]} if code else {}))
    if job["interactive"]:
        _serve_calls(func, Path(job["out_dir"]), proto)
        return
    for index in range(job["start"], len(job["calls"])):
        _run_case(func, index, job["calls"][index], Path(job["out_dir"]), proto)


def _one_blas_thread() -> None:
    """Hold BLAS to one thread, as the grader's oracle timing does (a forked worker's numpy was loaded earlier).

    Only the cost of the student's own code is compared: extra BLAS threads would add CPU time, never hide it.
    """
    try:
        from threadpoolctl import threadpool_limits  # type: ignore[import-untyped]

        threadpool_limits(limits=1)
    except Exception:  # noqa: BLE001 - without threadpoolctl the environment's thread counts apply
        pass


def _serve_calls(func, out_dir: Path, proto) -> None:
    """Interactive jobs (cache-scaling): each call's arguments arrive only when the grader starts it."""
    _one_blas_thread()
    fd = protocol.inherited(os.environ.pop(protocol.CALLS_FD_ENV), os.O_RDONLY)
    os.set_inheritable(fd, False)
    with os.fdopen(fd, "r") as calls:
        for line in calls:
            request = json.loads(line)
            _run_case(func, request["case"], request["args"], out_dir, proto)


if __name__ == "__main__":
    main()
