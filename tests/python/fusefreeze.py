#!/usr/bin/python3
"""fusefreeze — a passthrough FUSE filesystem that a test can freeze and thaw: a stand-in for a
parallel-filesystem client stuck on a dead server (a write blocks in the kernel until released).

    fs = FrozenFS(backing_dir, mountpoint)
    ok, reason = FrozenFS.available()      # False (with the reason) where FUSE cannot be used
    with fs:                               # start(): mounted and answering; stop() on exit
        ...                                # everything under mountpoint lands in backing_dir
        fs.freeze()                        # every operation that enters the FS from now on blocks
        ...
        fs.thaw()                          # ...and goes on

The filesystem is served by a child process: this file run as a script,

    /usr/bin/python3 fusefreeze.py BACKING MOUNTPOINT CONTROL_FILE

in the foreground and multithreaded (libfuse 2 through fusepy), so a blocked operation does not
hold unrelated ones while the FS is not frozen.

How it freezes. The control file (outside the mount) existing means "frozen". Every operation
checks it when it enters the FS — so an operation that starts after freeze() returned always
blocks, there is no window — and a frozen operation then waits, polling every 10 ms, until the
file is gone. What a hung NFS/Lustre client does is the default (``freeze()`` /
``freeze(reads=True)``, control file content "all"): *every* request that reaches the FS blocks —
getattr, lookup, readdir, read, statfs and access as well as open, create, write, flush, fsync
(data and directories), truncate, mkdir, rmdir, unlink, rename, link, symlink, chmod, chown,
utimens and release. Only what the kernel answers from its own caches goes on (attributes and
names for up to 1 s, the libfuse defaults; pages read before), as on a real client.
``freeze(reads=False)`` (content "writes") blocks only the operations that change data or
metadata (everything above but getattr, readdir, read, readlink, statfs, access, opendir,
releasedir, xattr reads).

Notes for callers:
- No writeback cache: each write(2) is one or more FUSE WRITE requests answered only after the
  backing pwrite, so a frozen FS blocks the writer in the kernel (D state) — not killable until
  thawed or until the FS process is gone. Thaw before stopping a process that writes here.
- O_DIRECT opens work: the kernel takes O_DIRECT on this mount and the passthrough opens the
  backing file without it (the FS process's buffers are not aligned).
- fallocate is not implemented (fusepy has no such operation): callers get EOPNOTSUPP and fall
  back, as on many parallel filesystems.
- libfuse 2 starts a thread per request in flight (15 blocked writes were checked), so a freeze
  with reads=False still answers reads. The kernel holds a directory's lock across a call
  blocked in it: other calls in that directory wait in the kernel, not in the FS.
- The number of operations blocked right now is published in CONTROL_FILE + ".blocked"
  (FrozenFS.blocked_ops(), wait_blocked()).
- stop() (and leaving the with block, whatever happened) thaws, unmounts (fusermount3 -u, then
  fusermount -u, then umount -l) and reaps the child; a child that will not exit is killed and a
  mount it leaves behind is detached.
"""

import errno
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

POLL_SECONDS = 0.01  # how often a frozen operation looks at the control file again


def _import_fusepy():
    """The fusepy module (Debian's python3-fusepy names it `fusepy`; pip's package `fuse`)."""
    try:
        import fusepy as module
    except ImportError:
        import fuse as module  # pip install fusepy
        if not hasattr(module, "Operations") or not hasattr(module, "FUSE"):
            raise ImportError("the 'fuse' module here is not fusepy") from None
    return module


# --------------------------------------------------------------------------------------------
# The filesystem (runs in the child process)
# --------------------------------------------------------------------------------------------


class _Gate:
    """Blocks operations while the control file exists (see the module docstring)."""

    def __init__(self, control):
        self.control = control
        self.status = control + ".blocked"
        self._lock = threading.Lock()
        self._blocked = 0
        self._publish()

    def _mode(self):
        """None (not frozen), "all" or "writes"."""
        try:
            with open(self.control, "r") as f:
                mode = f.read().strip()
        except FileNotFoundError:
            return None
        except OSError:
            return "all"  # unreadable while being replaced: treat as frozen, look again
        return "writes" if mode == "writes" else "all"

    def _publish(self):
        # Under self._lock (or before any thread exists). Written aside and renamed: readers
        # never see a partial number.
        tmp = "%s.%d.tmp" % (self.status, os.getpid())
        try:
            with open(tmp, "w") as f:
                f.write("%d\n" % self._blocked)
            os.replace(tmp, self.status)
        except OSError:
            pass  # diagnostics only

    def _frozen_for(self, modifies):
        mode = self._mode()
        return mode is not None and (modifies or mode == "all")

    def enter(self, modifies):
        if not self._frozen_for(modifies):
            return
        with self._lock:
            self._blocked += 1
            self._publish()
        try:
            while self._frozen_for(modifies):
                time.sleep(POLL_SECONDS)
        finally:
            with self._lock:
                self._blocked -= 1
                self._publish()


def _make_operations(fusepy, root, gate):
    """A passthrough Operations object over `root` (raw_fi: file ops get fuse_file_info)."""
    FuseOSError = fusepy.FuseOSError
    FileInfo = fusepy.fuse_file_info

    def handle(fi):
        """The backing fd of a fuse_file_info, or None (fusepy passes a NULL pointer or None
        when the kernel named no open file)."""
        return fi.fh if isinstance(fi, FileInfo) and fi.fh else None

    def oserror(fn):
        def wrapped(*args, **kwargs):
            try:
                return fn(*args, **kwargs)
            except OSError as e:
                if isinstance(e, FuseOSError):
                    raise
                raise FuseOSError(e.errno or errno.EIO) from None
        wrapped.__name__ = fn.__name__
        return wrapped

    class Passthrough(fusepy.Operations):
        use_ns = True  # utimens/getattr times in nanoseconds

        def _p(self, path):
            return os.path.join(root, path.lstrip("/"))

        # ---- reads (blocked by a full freeze only) ----

        @oserror
        def getattr(self, path, fi=None):
            gate.enter(False)
            if handle(fi) is not None:
                st = os.fstat(handle(fi))
            else:
                st = os.lstat(self._p(path))
            return {
                "st_mode": st.st_mode, "st_nlink": st.st_nlink, "st_uid": st.st_uid,
                "st_gid": st.st_gid, "st_size": st.st_size, "st_blocks": st.st_blocks,
                "st_atime": st.st_atime_ns, "st_mtime": st.st_mtime_ns,
                "st_ctime": st.st_ctime_ns, "st_ino": st.st_ino,
            }

        @oserror
        def access(self, path, amode):
            gate.enter(False)
            if not os.access(self._p(path), amode):
                raise FuseOSError(errno.EACCES)
            return 0

        @oserror
        def opendir(self, path):
            gate.enter(False)
            if not os.path.isdir(self._p(path)):
                raise FuseOSError(errno.ENOTDIR)
            return 0

        @oserror
        def readdir(self, path, fh):
            gate.enter(False)
            return [".", ".."] + os.listdir(self._p(path))

        @oserror
        def releasedir(self, path, fh):
            gate.enter(False)
            return 0

        @oserror
        def readlink(self, path):
            gate.enter(False)
            return os.readlink(self._p(path))

        @oserror
        def statfs(self, path):
            gate.enter(False)
            sv = os.statvfs(self._p(path))
            return {k: getattr(sv, k) for k in (
                "f_bavail", "f_bfree", "f_blocks", "f_bsize", "f_favail", "f_ffree", "f_files",
                "f_flag", "f_frsize", "f_namemax")}

        @oserror
        def read(self, path, size, offset, fi):
            gate.enter(False)
            return os.pread(fi.fh, size, offset)

        @oserror
        def getxattr(self, path, name, position=0):
            gate.enter(False)
            try:
                return os.getxattr(self._p(path), name, follow_symlinks=False)
            except OSError as e:
                raise FuseOSError(e.errno or errno.ENODATA) from None

        @oserror
        def listxattr(self, path):
            gate.enter(False)
            return os.listxattr(self._p(path), follow_symlinks=False)

        # ---- data and metadata changes (blocked by every freeze) ----

        @oserror
        def open(self, path, fi):
            gate.enter(True)
            # The kernel does O_DIRECT for the mount's callers; the backing fd stays buffered
            # (our buffers are not aligned). O_CREAT/O_EXCL were handled by the kernel already.
            flags = fi.flags & ~(os.O_DIRECT | os.O_CREAT | os.O_EXCL | os.O_NOCTTY)
            fi.fh = os.open(self._p(path), flags | os.O_CLOEXEC)
            return 0

        @oserror
        def create(self, path, mode, fi):
            gate.enter(True)
            flags = fi.flags & ~(os.O_DIRECT | os.O_NOCTTY)
            fi.fh = os.open(self._p(path), flags | os.O_CREAT | os.O_CLOEXEC, mode)
            return 0

        @oserror
        def write(self, path, data, offset, fi):
            gate.enter(True)
            return os.pwrite(fi.fh, data, offset)

        @oserror
        def truncate(self, path, length, fi=None):
            gate.enter(True)
            if handle(fi) is not None:
                os.ftruncate(handle(fi), length)
            else:
                os.truncate(self._p(path), length)
            return 0

        @oserror
        def flush(self, path, fi):
            gate.enter(True)
            # close(2) of one of the caller's descriptors: nothing to do for a passthrough
            # (the backing fd lives until release), but a hung server hangs close too.
            return 0

        @oserror
        def release(self, path, fi):
            gate.enter(True)
            os.close(fi.fh)
            return 0

        @oserror
        def fsync(self, path, datasync, fi):
            gate.enter(True)
            if datasync:
                os.fdatasync(fi.fh)
            else:
                os.fsync(fi.fh)
            return 0

        @oserror
        def fsyncdir(self, path, datasync, fh):
            gate.enter(True)
            fd = os.open(self._p(path), os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
            return 0

        @oserror
        def mkdir(self, path, mode):
            gate.enter(True)
            os.mkdir(self._p(path), mode)
            return 0

        @oserror
        def rmdir(self, path):
            gate.enter(True)
            os.rmdir(self._p(path))
            return 0

        @oserror
        def unlink(self, path):
            gate.enter(True)
            os.unlink(self._p(path))
            return 0

        @oserror
        def rename(self, old, new):
            gate.enter(True)
            os.rename(self._p(old), self._p(new))
            return 0

        @oserror
        def link(self, target, source):
            # fusepy: link(target, source) makes `target` a hard link to `source`.
            gate.enter(True)
            os.link(self._p(source), self._p(target))
            return 0

        @oserror
        def symlink(self, target, source):
            # fusepy: symlink(target, source) makes `target` -> `source` (source verbatim).
            gate.enter(True)
            os.symlink(source, self._p(target))
            return 0

        @oserror
        def chmod(self, path, mode):
            gate.enter(True)
            os.chmod(self._p(path), mode)
            return 0

        @oserror
        def chown(self, path, uid, gid):
            gate.enter(True)
            os.chown(self._p(path), uid, gid, follow_symlinks=False)
            return 0

        @oserror
        def utimens(self, path, times=None):
            gate.enter(True)
            if times is None:
                os.utime(self._p(path), follow_symlinks=False)
            else:
                os.utime(self._p(path), ns=(int(times[0]), int(times[1])),
                         follow_symlinks=False)
            return 0

        @oserror
        def setxattr(self, path, name, value, options, position=0):
            gate.enter(True)
            os.setxattr(self._p(path), name, value, options, follow_symlinks=False)
            return 0

        @oserror
        def removexattr(self, path, name):
            gate.enter(True)
            os.removexattr(self._p(path), name, follow_symlinks=False)
            return 0

    # Not implemented on purpose: fallocate (fusepy has no such operation; callers get
    # EOPNOTSUPP), mknod, lock (the kernel does local locks), ioctl, bmap.
    Passthrough.mknod = None
    Passthrough.lock = None
    Passthrough.ioctl = None
    Passthrough.bmap = None
    Passthrough.init = None
    Passthrough.destroy = None
    return Passthrough()


def serve(backing, mountpoint, control):
    """Mounts the filesystem and serves it until unmounted or signalled (SIGTERM/SIGINT/SIGHUP:
    libfuse leaves its loop and unmounts)."""
    fusepy = _import_fusepy()
    import warnings
    warnings.simplefilter("ignore", DeprecationWarning)
    gate = _Gate(os.path.abspath(control))
    ops = _make_operations(fusepy, os.path.abspath(backing), gate)
    fusepy.FUSE(ops, mountpoint, raw_fi=True, foreground=True, nothreads=False,
                allow_other=False, big_writes=True, fsname="fusefreeze", subtype="fusefreeze")


# --------------------------------------------------------------------------------------------
# The test side
# --------------------------------------------------------------------------------------------


def _unescape_mount_field(s):
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), s)


def mounted_at(path):
    """Whether /proc/mounts lists a mount at `path` (never touches the mount itself, so it
    answers for a frozen or dead FUSE filesystem too)."""
    target = os.path.realpath(path)
    try:
        with open("/proc/mounts", "r") as f:
            for line in f:
                fields = line.split()
                if len(fields) >= 2 and _unescape_mount_field(fields[1]) == target:
                    return True
    except OSError:
        pass
    return False


class FrozenFS:
    """A passthrough FUSE mount of `backing_dir` at `mountpoint` that can be frozen and thawed
    (see the module docstring). The control file defaults to a fresh temporary directory."""

    SCRIPT = os.path.abspath(__file__)
    PYTHON = "/usr/bin/python3" if os.access("/usr/bin/python3", os.X_OK) else sys.executable

    _available = None  # cached (bool, reason)

    def __init__(self, backing_dir, mountpoint, control_file=None):
        self.backing = os.path.abspath(backing_dir)
        self.mountpoint = os.path.realpath(mountpoint)
        self._own_dir = None
        if control_file is None:
            self._own_dir = tempfile.mkdtemp(prefix="fusefreeze-ctl-")
            control_file = os.path.join(self._own_dir, "frozen")
        self.control = os.path.abspath(control_file)
        self.log_path = self.control + ".log"
        self.proc = None
        self._log = None

    # ---- availability ----

    @classmethod
    def available(cls):
        """(True, "") when a FrozenFS can be mounted here, else (False, why). Tries a real mount
        once (cached)."""
        if cls._available is None:
            cls._available = cls._probe()
        return cls._available

    @classmethod
    def _probe(cls):
        if not os.path.exists("/dev/fuse"):
            return False, "/dev/fuse does not exist (no FUSE in this kernel or container)"
        if not os.access("/dev/fuse", os.R_OK | os.W_OK):
            return False, "/dev/fuse is not readable and writable by uid %d" % os.getuid()
        probe = subprocess.run(
            [cls.PYTHON, "-c", "import sys; sys.path.insert(0, %r); import fusefreeze; "
             "fusefreeze._import_fusepy()" % os.path.dirname(cls.SCRIPT)],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=60)
        if probe.returncode != 0:
            last = (probe.stdout.strip().splitlines() or ["?"])[-1]
            return False, "fusepy is not importable by %s (%s)" % (cls.PYTHON, last)
        if shutil.which("fusermount3") is None:
            return False, "fusermount3 is not installed (Debian package fuse3)"
        top = tempfile.mkdtemp(prefix="fusefreeze-probe-")
        try:
            backing, mnt = os.path.join(top, "backing"), os.path.join(top, "mnt")
            os.mkdir(backing)
            os.mkdir(mnt)
            fs = cls(backing, mnt, control_file=os.path.join(top, "frozen"))
            try:
                fs.start(ready_timeout=15.0)
                with open(os.path.join(mnt, "probe"), "wb") as f:
                    f.write(b"fusefreeze")
                with open(os.path.join(backing, "probe"), "rb") as f:
                    if f.read() != b"fusefreeze":
                        return False, "a write through the FUSE mount did not reach the backing dir"
            except Exception as e:  # noqa: BLE001 - any failure means "not available"
                return False, "mounting a FUSE filesystem failed: %s" % (e,)
            finally:
                fs.stop()
            if mounted_at(mnt):
                return False, "the probe mount at %s could not be unmounted" % mnt
        finally:
            shutil.rmtree(top, ignore_errors=True)
        return True, ""

    # ---- lifecycle ----

    def start(self, ready_timeout=10.0):
        """Mounts (starts the child) and returns once the mount is listed in /proc/mounts and
        answers a stat of its root."""
        if self.proc is not None:
            raise RuntimeError("FrozenFS already started")
        if mounted_at(self.mountpoint):
            raise RuntimeError("%s is already a mount point" % self.mountpoint)
        os.makedirs(self.backing, exist_ok=True)
        os.makedirs(self.mountpoint, exist_ok=True)
        self.thaw()
        self._log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            [self.PYTHON, self.SCRIPT, self.backing, self.mountpoint, self.control],
            stdin=subprocess.DEVNULL, stdout=self._log, stderr=subprocess.STDOUT,
            start_new_session=True)  # a ^C to the test does not kill it before it unmounts
        deadline = time.monotonic() + ready_timeout
        try:
            while not mounted_at(self.mountpoint):
                if self.proc.poll() is not None:
                    raise RuntimeError("fusefreeze exited with status %d before mounting: %s"
                                       % (self.proc.returncode, self.log().strip()))
                if time.monotonic() > deadline:
                    raise RuntimeError("fusefreeze did not mount %s within %.0f s: %s"
                                       % (self.mountpoint, ready_timeout, self.log().strip()))
                time.sleep(0.01)
            os.stat(self.mountpoint)  # the FS answers (not frozen: thawed above)
        except BaseException:
            self.stop()
            raise
        return self

    def freeze(self, reads=True):
        """From now on every operation entering the FS blocks (reads=False: only those that
        change data or metadata) until thaw()."""
        tmp = self.control + ".tmp"
        with open(tmp, "w") as f:
            f.write("all\n" if reads else "writes\n")
        os.replace(tmp, self.control)  # atomic: the FS never sees a half-written mode

    def thaw(self):
        """Releases every blocked operation (within POLL_SECONDS) and lets new ones through."""
        try:
            os.unlink(self.control)
        except FileNotFoundError:
            pass

    @property
    def frozen(self):
        return os.path.exists(self.control)

    def blocked_ops(self):
        """How many operations are blocked inside the FS right now (as the FS published it)."""
        try:
            with open(self.control + ".blocked", "r") as f:
                return int(f.read().strip() or 0)
        except (OSError, ValueError):
            return 0

    def wait_blocked(self, count=1, timeout=10.0):
        """Waits (bounded) until at least `count` operations are blocked; True if they are."""
        deadline = time.monotonic() + timeout
        while self.blocked_ops() < count:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.01)
        return True

    def mounted(self):
        return mounted_at(self.mountpoint)

    def log(self):
        try:
            with open(self.log_path, "r", errors="replace") as f:
                return f.read()
        except OSError:
            return ""

    def _unmount(self):
        for cmd in (["fusermount3", "-u", "-q", self.mountpoint],
                    ["fusermount", "-u", "-q", self.mountpoint]):
            if not self.mounted():
                return
            if shutil.which(cmd[0]) is None:
                continue
            try:
                subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               timeout=15)
            except subprocess.TimeoutExpired:
                pass
        if self.mounted():
            self._lazy_unmount()

    def _lazy_unmount(self):
        try:
            subprocess.run(["umount", "-l", self.mountpoint], stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL, timeout=15)
        except (OSError, subprocess.TimeoutExpired):
            pass

    def _abort_connection(self):
        """Aborts every FUSE connection whose mount is ours (requests fail with ENOTCONN): the
        last resort that frees processes blocked on a mount whose server will not exit."""
        try:
            with open("/proc/self/mountinfo", "r") as f:
                for line in f:
                    fields = line.split()
                    if len(fields) > 4 and _unescape_mount_field(fields[4]) == self.mountpoint:
                        minor = fields[2].split(":")[1]
                        path = "/sys/fs/fuse/connections/%s/abort" % minor
                        try:
                            with open(path, "w") as a:
                                a.write("1")
                        except OSError:
                            pass
        except OSError:
            pass

    def stop(self):
        """Thaws, unmounts and reaps the child. Idempotent; never raises for a failed unmount
        but leaves no mount and no child behind if at all possible."""
        self.thaw()
        try:
            if self.proc is not None or self.mounted():
                self._unmount()
            if self.proc is not None:
                try:
                    self.proc.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    self.proc.send_signal(signal.SIGTERM)  # libfuse: leave the loop, unmount
                    try:
                        self.proc.wait(timeout=10)
                    except subprocess.TimeoutExpired:
                        self._abort_connection()
                        self.proc.kill()
                        self.proc.wait()
            if self.mounted():  # a child that died without unmounting
                self._abort_connection()
                self._lazy_unmount()
        finally:
            self.proc = None
            if self._log is not None:
                self._log.close()
                self._log = None
            for leftover in (self.control + ".tmp", self.control + ".blocked"):
                try:
                    os.unlink(leftover)
                except OSError:
                    pass
            if self._own_dir is not None and not self.mounted():
                shutil.rmtree(self._own_dir, ignore_errors=True)
                self._own_dir = None

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()
        return False


def main(argv):
    if len(argv) != 4:
        sys.stderr.write("usage: %s BACKING MOUNTPOINT CONTROL_FILE\n" % argv[0])
        return 2
    serve(argv[1], argv[2], argv[3])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
