"""What status's log read costs with a 1 GiB log before this start vs an empty one.

    .venv/bin/python bench/log_read.py [--gib 1] [--reps 7] [--sparse] [--dir /var/tmp]

Builds two logs in a temporary directory, each ending with the same "this start": the launcher's
start marker, its <log>.start sidecar and --lines progress lines (default 3600, an hour at one a
second). The "big" log has --gib GiB of earlier starts' lines before it (real lines by default,
written in a few seconds; --sparse makes it a hole, which costs no disk but reads as NUL bytes).
Times, min and median of --reps runs, with the files in the page cache (both cases alike):
- status: trainer_status.read_log (seeks to the sidecar's offset, reads the marker and the tail);
- proof: the restart job's reader (proof.log_file.LogFileReader), first poll (seeks to the sidecar's offset,
  reads this start);
- scan fallback: status's read without the sidecar (the file scanned backwards for the marker);
- no marker: an invocation the log does not hold (the worst fallback: the whole file scanned);
- from byte 0: the read before the sidecar existed (every byte through the parser), big log once.
Prints the figures and "big / empty" for status with the target (<= 1.5x). Runs without the lab.
"""
import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "collections"))

from ansible_collections.dflash.trainer.plugins.module_utils.proof import log_file as lf  # noqa: E402
from ansible_collections.dflash.trainer.plugins.module_utils.proof import trainer_log as tl  # noqa: E402
from ansible_collections.dflash.trainer.plugins.module_utils.plan import status as trainer_status  # noqa: E402

INV = "6f0c1b7e2a8d4c5e9f1a2b3c4d5e6f70"
OLD = "0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a"
REL = "0123456789abcdef"
LINE = "step=%d loss=1.9234 tok/s=10250.3 queue_target=4 queue_drafter=4\n"


def progress(n, first=0):
    return "".join(LINE % i for i in range(first, first + n)).encode()


def build(path, before_bytes, lines, sparse):
    with open(path, "wb") as f:
        if before_bytes and sparse:
            f.truncate(before_bytes - 1)  # a hole, then the newline that ends it
            f.seek(before_bytes - 1)
            f.write(b"\n")
        elif before_bytes:
            f.write((tl.marker_line(OLD, REL, 1, "2026-01-01T00:00:00+00:00") + "\n").encode())
            block = progress(16384)
            while f.tell() + len(block) <= before_bytes:
                f.write(block)
            f.write(b"\n" * (before_bytes - f.tell()))
        offset = f.tell()
        f.write((tl.marker_line(INV, REL, 4242, "2026-11-30T04:05:06+00:00") + "\n").encode())
        f.write(progress(lines))
    st = os.stat(path)
    with open(lf.sidecar_path(path), "w") as f:
        f.write('{"invocation": "%s", "offset": %d, "inode": %d, "dev": %d}\n' % (INV, offset, st.st_ino, st.st_dev))
    return offset


def timed(fn, reps):
    times = []
    for _rep in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times), statistics.median(times)


def status_read(path):
    follower, where = trainer_status.read_log(path, INV)
    assert follower.analysis.last_step is not None and where.problem is None
    return where


def proof_read(path):
    reader = lf.LogFileReader(path, tl.StartLog(INV))
    reader.poll(now=0)
    assert reader.follower.analysis.last_step is not None


def no_sidecar_read(path):
    os.rename(lf.sidecar_path(path), lf.sidecar_path(path) + ".off")
    try:
        follower, where = trainer_status.read_log(path, INV)
        assert where.source == "scan" and follower.analysis.last_step is not None
    finally:
        os.rename(lf.sidecar_path(path) + ".off", lf.sidecar_path(path))


def absent_read(path):
    follower, where = trainer_status.read_log(path, "ffffffffffffffffffffffffffffffff")
    assert where.source == "end" and follower.marker is None


def from_zero_read(path):
    follower = tl.StartLog(INV, keep_lines=50)
    with open(path, "rb") as f:
        while True:
            data = f.read(1 << 20)
            if not data:
                break
            follower.feed(data.decode("utf-8", "replace"))
    follower.finish()
    assert follower.analysis.last_step is not None


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gib", type=float, default=1.0)
    ap.add_argument("--lines", type=int, default=3600)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--sparse", action="store_true")
    ap.add_argument("--dir", default=None)
    ap.add_argument("--skip-from-zero", action="store_true", help="skip the slow from-byte-0 figure")
    args = ap.parse_args()

    tmp = tempfile.mkdtemp(prefix="dflash-log-read-", dir=args.dir)
    try:
        empty = os.path.join(tmp, "empty.log")
        big = os.path.join(tmp, "big.log")
        build(empty, 0, args.lines, False)
        t0 = time.perf_counter()
        offset = build(big, int(args.gib * (1 << 30)), args.lines, args.sparse)
        print("built %s: %.2f GiB before this start (%s, %.1f s); this start: marker + %d lines (%d bytes)"
              % (big, offset / (1 << 30), "sparse" if args.sparse else "real lines", time.perf_counter() - t0,
                 args.lines, os.path.getsize(empty)))
        for path in (empty, big):  # both in the page cache, alike
            status_read(path)
        rows = []
        for what, fn in (("status read_log", status_read), ("proof first poll", proof_read),
                         ("status, no sidecar (backward scan)", no_sidecar_read),
                         ("status, no marker of the invocation (worst case: whole-file scan)", absent_read)):
            e = timed(lambda: fn(empty), args.reps)
            b = timed(lambda: fn(big), args.reps)
            rows.append((what, e, b))
        if not args.skip_from_zero:
            rows.append(("before: read from byte 0", timed(lambda: from_zero_read(empty), args.reps),
                         timed(lambda: from_zero_read(big), 1)))
        print()
        print("| figure | empty log: min / median | %g GiB log: min / median | big / empty (medians) |" % args.gib)
        print("|---|---|---|---|")
        for what, e, b in rows:
            print("| %s | %.2f / %.2f ms | %.2f / %.2f ms | %.2f× |" % (
                what, e[0] * 1e3, e[1] * 1e3, b[0] * 1e3, b[1] * 1e3, b[1] / e[1]))
        ratio = rows[0][2][1] / rows[0][1][1]
        print()
        print("status read_log, %g GiB / empty: %.2f× (target <= 1.5×): %s"
              % (args.gib, ratio, "met" if ratio <= 1.5 else "MISSED"))
        return 0 if ratio <= 1.5 else 1
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
