#!/usr/bin/env python3
"""Split each fdatasync of the chosen processes into its block-layer steps.

Input: `perf script -F comm,pid,tid,time,event,trace` of a `perf record` with the events
block:block_rq_issue, block:block_rq_complete, syscalls:sys_enter_fdatasync and
syscalls:sys_exit_fdatasync (fsyncsplit.sh makes it).

    fsyncsplit.py SCRIPT_OUTPUT LABEL=PID[,PID...] [LABEL=comm:NAME ...]

For every fdatasync of a group's threads: enter -> the data write issued (by the thread
itself) -> that write completed on the device -> the syscall's exit, split in three: the
wait until the next device flush is issued (the block layer runs one flush at a time per
queue, so a flush already running is waited for), that flush on the device (flushes are
issued by a kworker and complete without an id: matched to callers by time, the first
issued after the write completed and the last completed before the exit), and its
completion -> the exit (the thread's wake-up); and
whether the thread also wrote a metadata block (rwbs "WSM": on ext4 without a journal,
the inode after an mtime change, docs/design/write-path.md). Prints medians per group
and kind. If the recording has sched:sched_wakeup and sched:sched_switch too
(fsyncsplit.sh with FSYNCSPLIT_SCHED=1), also how long, inside a group's fdatasyncs, the
caller waited for a core after its data write completed (woken -> switched in) and the
block layer's kworkers (kworker/*H, which issue the flushes) waited after each wake-up;
with the cpu field, which thread held a kworker's core when it was woken (the group's
own, or which other program); and the group's context switches and the wake-ups its
threads issued per fdatasync.
"""
import bisect
import collections
import re
import statistics
import sys

LINE = re.compile(r'\s*(\S+)\s+(\d+)/(\d+)\s+(?:\[(\d+)\]\s+)?([\d.]+):\s+(\S+):\s*(.*)')


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    groups = []
    for a in sys.argv[2:]:
        label, _, sel = a.partition('=')
        if sel.startswith('comm:'):
            groups.append((label, None, sel[5:]))
        else:
            groups.append((label, set(sel.split(',')), None))

    def group_of(comm, pid):
        for label, pids, name in groups:
            if (pids and pid in pids) or (name and comm == name):
                return label
        return None

    cur = {}  # tid -> the fdatasync in progress
    flush_issued, flush_done = [], []  # times of every device flush's issue and completion
    rows = collections.defaultdict(list)
    done = []
    unmatched = collections.Counter()
    woken = {}  # tid -> when it was last woken
    runq = []  # (switched in, waited µs, tid, comm, holder) of every thread switched in after a wake-up
    oncpu = {}  # cpu -> (comm, tid) running there
    holder = {}  # tid -> (comm, tid) running on its core when it was woken
    tid_pid = {}
    switches, wakeups, calls = collections.Counter(), collections.Counter(), collections.Counter()
    for line in open(sys.argv[1], errors='replace'):
        m = LINE.match(line)
        if not m:
            continue
        comm, pid, tid, cpu, t, ev, tr = m.groups()
        t = float(t)
        f = tr.split()
        tid_pid[tid] = pid
        if ev == 'sched:sched_wakeup':
            w = re.search(r'pid=(\d+) .*target_cpu=(\d+)', tr)
            if w:
                woken[w.group(1)] = t
                holder[w.group(1)] = oncpu.get(int(w.group(2)), ('?', '?'))
            if group_of(comm, pid):
                wakeups[group_of(comm, pid)] += 1
            continue
        if ev == 'sched:sched_switch':
            w = re.search(r'prev_comm=(.*) prev_pid=(\d+) .*==> next_comm=(.*) next_pid=(\d+)', tr)
            if w:
                if cpu is not None:
                    oncpu[int(cpu)] = (w.group(3), w.group(4))
                g = group_of(w.group(1), tid_pid.get(w.group(2), ''))
                if g:
                    switches[g] += 1
                if w.group(4) in woken:
                    runq.append((t, (t - woken.pop(w.group(4))) * 1e6, w.group(4), w.group(3),
                                 holder.pop(w.group(4), ('?', '?'))))
            continue
        if len(f) > 1 and f[1] == 'FF':
            (flush_issued if ev == 'block:block_rq_issue' else flush_done).append(t)
            continue
        if ev == 'block:block_rq_issue':
            c = cur.get(tid)
            if c is None or len(f) < 2 or f[1].startswith('F') or '()' not in tr:
                continue
            if 'M' in f[1]:
                c['meta'] = True
            elif 'issued' not in c:
                c['issued'], c['sector'] = t, tr.split('()')[1].split()[0]
        elif ev == 'block:block_rq_complete':
            if '()' not in tr:
                continue
            sector = tr.split('()')[1].split()[0]
            for c in cur.values():
                if c.get('sector') == sector and 'written' not in c:
                    c['written'] = t
        elif ev == 'syscalls:sys_enter_fdatasync':
            g = group_of(comm, pid)
            if g:
                cur[tid] = {'group': g, 'enter': t}
                calls[g] += 1
        elif ev == 'syscalls:sys_exit_fdatasync' and tid in cur:
            c = cur.pop(tid)
            if 'issued' in c and 'written' in c:
                c['exit'], c['tid'] = t, tid
                done.append(c)
            else:
                unmatched[c['group']] += 1
    # Flush completions carry no id (several may be in flight): the caller's flush is the
    # first issued after its write completed, and the completion that woke it the last
    # one before its exit.
    flush_issued.sort()
    flush_done.sort()
    for c in done:
        i = bisect.bisect_left(flush_issued, c['written'])
        j = bisect.bisect_right(flush_done, c['exit']) - 1
        if i == len(flush_issued) or j < 0 or flush_done[j] < flush_issued[i] or flush_issued[i] > c['exit']:
            unmatched[c['group']] += 1
            continue
        fi, fc = flush_issued[i], flush_done[j]
        rows[(c['group'], c.get('meta', False))].append((
            (c['issued'] - c['enter']) * 1e6, (c['written'] - c['issued']) * 1e6,
            (fi - c['written']) * 1e6, (fc - fi) * 1e6, (c['exit'] - fc) * 1e6,
            (c['exit'] - c['enter']) * 1e6))
    for (g, meta), r in sorted(rows.items()):
        total = sum(len(v) for (gg, _), v in rows.items() if gg == g)
        med = [statistics.median(x[i] for x in r) for i in range(6)]
        print(f"{g:10s} {'inode written' if meta else 'data only':13s} n={len(r):6d} ({100 * len(r) / total:3.0f} %)  p50 µs:"
              f" enter->write issued {med[0]:4.0f}, write on device {med[1]:4.0f},"
              f" ->flush issued {med[2]:4.0f}, flush on device {med[3]:4.0f}, ->exit {med[4]:4.0f}; total {med[5]:4.0f}")
    if runq:
        runq.sort()
        at = [r[0] for r in runq]
        caller, kworker = collections.defaultdict(list), collections.defaultdict(list)
        held = collections.defaultdict(lambda: collections.defaultdict(list))
        for c in done:
            lo, hi = bisect.bisect_left(at, c['written']), bisect.bisect_right(at, c['exit'])
            for _, waited, tid, comm, (hcomm, htid) in runq[lo:hi]:
                if tid == c['tid'] and not caller_seen(c):
                    caller[c['group']].append(waited)
                elif comm.startswith('kworker/') and comm.endswith('H'):
                    kworker[c['group']].append(waited)
                    who = group_of(hcomm, tid_pid.get(htid, ''))
                    who = f"its own threads ({who})" if who else re.sub(r'[/:0-9].*', '', hcomm)
                    held[c['group']][who].append(waited)
        for g in sorted(set(caller) | set(kworker)):
            print(f"{g:10s} waits for a core inside the fdatasyncs, p50 / p90 µs: the caller after its write"
                  f" {pct(caller[g], .5):.0f} / {pct(caller[g], .9):.0f} (n={len(caller[g])}), the flush-issuing"
                  f" kworkers {pct(kworker[g], .5):.0f} / {pct(kworker[g], .9):.0f} (n={len(kworker[g])})")
            n = sum(len(v) for v in held[g].values())
            top = sorted(held[g].items(), key=lambda kv: -len(kv[1]))[:5]
            print(f"{g:10s} on a kworker's core when it was woken: " + ", ".join(
                f"{k} {100 * len(v) / n:.0f} % (its wait p50 {pct(v, .5):.0f} µs)" for k, v in top))
            if calls[g]:
                print(f"{g:10s} per fdatasync, whole recording: {switches[g] / calls[g]:.1f} context switches"
                      f" and {wakeups[g] / calls[g]:.1f} wake-ups issued by the group's threads")
    for g, n in sorted(unmatched.items()):
        print(f"{g:10s} {n} fdatasyncs without their own data write or a flush seen (not counted)")


def caller_seen(c):
    """Whether the caller's first switch-in after its write was taken (once per call)."""
    seen = c.get('seen', False)
    c['seen'] = True
    return seen


def pct(xs, q):
    xs = sorted(xs)
    return xs[int(q * (len(xs) - 1))] if xs else float('nan')


if __name__ == '__main__':
    main()
