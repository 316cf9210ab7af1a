"""A dead grader's temporary directories go, a live one's stay, and a link named like one is never followed."""

import errno
import os
from pathlib import Path

import pytest

from theinference import locks
from theinference.proc import tempdirs

DEAD, LIVE = "g" + "0" * 12, "g" + "1" * 12


def _owner(where: Path, token: str) -> int:
    return os.open(where / f"theinference-owner-{token}", os.O_RDWR | os.O_CREAT, 0o600)


def test_a_dead_graders_directories_go_and_a_live_ones_stay(tmp_path):
    tmp_path = tmp_path / "tmp"
    tmp_path.mkdir()
    os.close(_owner(tmp_path, DEAD))  # nobody holds its lock: its grader is dead
    live = _owner(tmp_path, LIVE)
    assert locks.lock(live)  # held, as a live grader holds its own (flock here, LockFileEx on Windows)
    for token in (DEAD, LIVE):
        (tmp_path / f"theinference-run-{token}-abcd1234").mkdir()
        (tmp_path / f"theinference-run-{token}-abcd1234" / "out.npy").write_bytes(b"x")
    (tmp_path / f"theinference-zygote-{DEAD}-x").mkdir()
    (tmp_path / "theinference-run-abcd1234").mkdir()  # from before tokens: whose, nothing says
    try:
        tempdirs.remove_leftovers(str(tmp_path))
        assert sorted(os.listdir(tmp_path)) == [
            "theinference-owner-" + LIVE,
            "theinference-run-abcd1234",
            f"theinference-run-{LIVE}-abcd1234",
        ]
    finally:
        os.close(live)


def test_a_link_named_like_a_dead_graders_directory_is_not_followed(tmp_path):
    precious = tmp_path / "precious"
    precious.mkdir()
    (precious / "keep.txt").write_text("keep")
    where = tmp_path / "tmp"
    where.mkdir()
    os.symlink(precious, where / f"theinference-run-{DEAD}-abcd1234")  # no owner file at all: its grader is gone
    os.symlink(precious, where / f"theinference-owner-{DEAD}")
    tempdirs.remove_leftovers(str(where))
    assert (precious / "keep.txt").read_text() == "keep"


def test_a_graders_first_directory_sweeps_and_is_named_for_it(tmp_path, monkeypatch):
    tmp_path = tmp_path / "tmp"
    tmp_path.mkdir()
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(tempdirs.tempfile, "tempdir", None)
    (tmp_path / f"theinference-stub-{DEAD}-x").mkdir()
    tempdirs._owner_token.cache_clear()
    made = Path(tempdirs.mkdtemp("run"))
    token = made.name.split("-")[2]
    assert made.parent == tmp_path and tempdirs._TOKEN.fullmatch(token)
    assert not (tmp_path / f"theinference-stub-{DEAD}-x").exists()
    assert (tmp_path / f"theinference-owner-{token}").is_file()
    assert not tempdirs._dead(str(tmp_path), token)  # this process holds its lock
    tempdirs._owner_token.cache_clear()
    monkeypatch.setattr(tempdirs.tempfile, "tempdir", None)


@pytest.mark.linux  # the zygote's socket (AF_UNIX), reached through /proc/self/fd
def test_a_socket_in_a_deep_temp_directory_is_bound_and_reached_through_a_short_address(tmp_path):
    """A $TMPDIR deep enough that its socket's path passes AF_UNIX's 107 bytes (pytest-xdist's, a CI runner's):
    the zygote did not start there (the grader's exit 3). The address through the directory's descriptor works."""
    import socket

    deep = tmp_path / ("d" * 60) / ("e" * 60)
    deep.mkdir(parents=True)
    path = str(deep / "zygote.sock")
    with pytest.raises(OSError):
        socket.socket(socket.AF_UNIX).bind(path)  # the plain path is too long
    address, fd = tempdirs.unix_address(path)
    assert fd is not None and len(address) < 40
    server = socket.socket(socket.AF_UNIX)
    server.bind(address)
    os.close(fd)
    server.listen(1)
    client_address, client_fd = tempdirs.unix_address(path)
    client = socket.socket(socket.AF_UNIX)
    client.connect(client_address)
    assert client_fd is not None
    os.close(client_fd)
    assert os.path.exists(path)  # the socket is where it was asked for
    client.close()
    server.close()
    assert tempdirs.unix_address("/tmp/short.sock") == ("/tmp/short.sock", None)


@pytest.mark.linux  # uids are leased on Linux only (the confinement levels)
def test_the_sweep_of_a_leased_uids_leftovers_keeps_what_it_owned_before_and_a_live_graders_files(tmp_path):
    """As root without bubblewrap the first lease is uid nobody, which may also be a running grader's own uid: after
    the run, only what that uid made during it goes, never a grader's owner file or directories (nor a file it had)."""
    from theinference.proc.sandbox import files_of, remove_files_of

    where = tmp_path / "tmp"
    where.mkdir()
    (where / "had-before.txt").write_text("x")
    before = files_of(os.getuid(), (str(where),))
    live = _owner(where, LIVE)
    assert locks.lock(live)  # a grader of the same uid, started during the lease
    os.close(_owner(where, DEAD))
    for token in (LIVE, DEAD):
        (where / f"theinference-run-{token}-abcd1234").mkdir()
    (where / "had-before.txt").write_text("written during the lease")
    (where / "litter.bin").write_bytes(b"x")
    (where / "litter-dir" / "deeper").mkdir(parents=True)
    (where / f"theinference-run-{LIVE}-named-like-its-dir").write_bytes(b"x")  # a file: no directory of a grader's
    (where / f"theinference-owner-{DEAD[:-1]}2").mkdir()  # a directory: no owner file (nor any lock held on it)
    try:
        removed = remove_files_of(os.getuid(), before, (str(where),))
        assert sorted(os.listdir(where)) == [
            "had-before.txt",
            "theinference-owner-" + LIVE,
            f"theinference-run-{LIVE}-abcd1234",
        ]
        assert sorted(Path(path).name for path in removed) == [
            "litter-dir",
            "litter.bin",
            "theinference-owner-" + DEAD,
            f"theinference-owner-{DEAD[:-1]}2",
            f"theinference-run-{DEAD}-abcd1234",
            f"theinference-run-{LIVE}-named-like-its-dir",
        ]
    finally:
        os.close(live)


@pytest.fixture
def fresh_grader(tmp_path, monkeypatch):
    """An empty temp directory, and a grader in this process that has made no directory there yet."""
    where = tmp_path / "tmp"
    where.mkdir()
    monkeypatch.setenv("TMPDIR", str(where))
    monkeypatch.setattr(tempdirs.tempfile, "tempdir", None)
    tempdirs._owner_token.cache_clear()
    yield where
    tempdirs._owner_token.cache_clear()
    monkeypatch.setattr(tempdirs.tempfile, "tempdir", None)


def test_where_an_open_file_cannot_be_renamed_the_owner_file_is_made_in_place_and_held(fresh_grader, monkeypatch):
    """Windows: a file open in a process can be neither renamed nor removed; the owner file is then made at its own
    name and locked there, and the grader's directories are a live grader's."""

    def in_use(src, dst):
        raise PermissionError(13, "The process cannot access the file because it is being used by another process")

    monkeypatch.setattr(tempdirs.os, "rename", in_use)
    made = Path(tempdirs.mkdtemp("run"))
    token = made.name.split("-")[2]
    assert sorted(os.listdir(fresh_grader)) == [f"theinference-owner-{token}", made.name]  # no pending name left
    assert not tempdirs._dead(str(fresh_grader), token)
    assert tempdirs.remove_leftovers(str(fresh_grader)) == [] and made.is_dir()


def test_where_no_kernel_lock_exists_a_graders_directories_have_no_token_and_it_sweeps_nothing(
    fresh_grader, monkeypatch
):
    """Nothing could tell such a grader alive (a lock file without a kernel lock outlives a killed grader), so its
    directories are named as no sweep removes, and it calls no other grader dead."""

    def no_lock(fd, blocking=True):
        raise locks.NoKernelLock(errno.ENOSYS, "this machine offers no kernel file lock")

    monkeypatch.setattr(tempdirs.locks, "lock", no_lock)
    os.close(_owner(fresh_grader, DEAD))  # a dead grader's, by its lock; but no lock can be tried here
    (fresh_grader / f"theinference-run-{DEAD}-abcd1234").mkdir()
    made = Path(tempdirs.mkdtemp("run"))
    assert made.name.startswith("theinference-run-") and tempdirs._token_of(made.name) is None
    assert sorted(os.listdir(fresh_grader)) == sorted(
        [f"theinference-owner-{DEAD}", f"theinference-run-{DEAD}-abcd1234", made.name]
    )
    assert tempdirs.remove_leftovers(str(fresh_grader)) == []


def test_without_uids_a_real_directory_is_ours_to_remove_and_a_link_never(tmp_path, monkeypatch):
    """Windows has no geteuid (a user's temp directory is their own): what stays refused is a link."""
    (tmp_path / "real").mkdir()
    os.symlink(tmp_path / "real", tmp_path / "link")
    monkeypatch.delattr(os, "geteuid", raising=False)
    assert tempdirs._ours_to_remove(str(tmp_path / "real"))
    assert not tempdirs._ours_to_remove(str(tmp_path / "link"))
    assert not tempdirs._ours_to_remove(str(tmp_path / "missing"))
