#!/usr/bin/env python3
# timeline of one window: per 0.5 ms, which groups ran on each CPU (cpu-clock samples) + switches of guestd/controld
import sys, re, subprocess, collections
data, log, burst, rep = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
for l in open(log):
    m = re.search(r'checkpoint pool: burst (\d+) rep (\d+): hits window (\d+)-(\d+)', l)
    if m and int(m.group(1)) == burst and int(m.group(2)) == rep:
        a, b = int(m.group(3)) / 1e9, int(m.group(4)) / 1e9
a -= 0.002
p = subprocess.run(['perf', 'script', '-i', data, '-F', 'comm,pid,tid,cpu,time,event,trace', '--ns', '--time', f'{a:.9f},{b:.9f}'], capture_output=True, text=True, errors='replace').stdout
for line in p.split('\n'):
    m = re.match(r'\s*(.+?)\s+(\d+)/(\d+)\s+\[(\d+)\]\s+([\d.]+):\s+(\S+):\s*(.*)', line)
    if not m: continue
    comm, pid, tid, cpu, t, ev, tr = m.groups()
    t = (float(t) - a) * 1000 - 2
    if ev == 'cpu-clock':
        print(f'{t:8.3f} cpu{cpu} {comm}/{tid}')
    elif ev == 'sched:sched_switch':
        print(f'{t:8.3f} cpu{cpu} SW {tr}')
    elif ev == 'sched:sched_wakeup':
        print(f'{t:8.3f} cpu{cpu} WK by {comm}/{tid}: {tr}')
