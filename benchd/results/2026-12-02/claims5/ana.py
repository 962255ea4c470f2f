#!/usr/bin/env python3
# cut `perf script` output to the pool suite's hits windows; shares per process and inclusive functions
import sys, re, collections, subprocess
data, log = sys.argv[1], sys.argv[2]
only = sys.argv[3] if len(sys.argv) > 3 else None  # e.g. "burst 1"
wins = []
for l in open(log):
    m = re.search(r'(\w+) pool: burst (\d+) rep (\d+): hits window (\d+)-(\d+)', l)
    if m and (only is None or int(m.group(2)) == int(only)):
        wins.append((int(m.group(4)) / 1e9, int(m.group(5)) / 1e9, m.group(1), int(m.group(2))))
wins.sort()
tot = sum(b - a for a, b, _, _ in wins)
print(f"# {len(wins)} windows, {tot*1000:.1f} ms in all")
p = subprocess.Popen(['perf', 'script', '-i', data, '-F', 'comm,pid,tid,time,event,ip,sym,dso,trace', '--ns'], stdout=subprocess.PIPE, text=True, errors='replace')
cnt = collections.Counter(); incl = collections.defaultdict(collections.Counter); self_ = collections.defaultdict(collections.Counter)
def inwin(t):
    for a, b, _, _ in wins:
        if a <= t <= b: return True
    return False
def grp(comm):
    if comm.startswith('controld'): return 'controld'
    if comm == 'guestd': return 'guestd'
    if comm in ('benchd',): return 'client'
    if comm in ('Xvfb', 'openbox', 'xterm', 'bash', 'sh'): return 'desktop:' + comm
    return 'other:' + comm
gips=set()
cur = None
def flush(c):
    if not c: return
    hdr, frames = c
    m = re.match(r'\s*(.+?)\s+(\d+)/(\d+)\s+([\d.]+):\s+(\S+):', hdr)
    if not m: return
    comm, t, ev = m.group(1), float(m.group(4)), m.group(5)
    if ev != 'cpu-clock:' and not ev.startswith('cpu-clock'): return
    if not inwin(t): return
    g = grp(comm)
    cnt[g] += 1
    seen = set()
    for i, f in enumerate(frames):
        fm = re.match(r'\s*[0-9a-f]+\s+(.+?)\s+\((.*)\)$', f)
        sym = fm.group(1) if fm else f.strip()
        if fm and sym.startswith('[unknown]') and 'guestd' in fm.group(2):
            ip = f.split()[0]; sym = 'G:' + ip; gips.add(ip)
        sym = re.sub(r'\+0x[0-9a-f]+$', '', sym)
        if i == 0: self_[g][sym] += 1
        if sym not in seen:
            seen.add(sym); incl[g][sym] += 1
for line in p.stdout:
    if line.strip() == '':
        flush(cur); cur = None; continue
    if cur is None: cur = (line, [])
    else: cur[1].append(line)
flush(cur)
gmap = {}
if gips:
    ips = sorted(gips)
    out = subprocess.run(['go','tool','addr2line','/tmp/claims5/guestd.img'], input='\n'.join('0x'+i for i in ips)+'\n', capture_output=True, text=True).stdout.split('\n')
    for k, ip in enumerate(ips): gmap['G:'+ip] = out[2*k] if 2*k < len(out) else ip
def rn(c):
    r = collections.Counter()
    for s, n in c.items(): r[gmap.get(s, s)] += n
    return r
for g in list(incl): incl[g] = rn(incl[g]); self_[g] = rn(self_[g])
N = sum(cnt.values())
print(f"# {N} cpu-clock samples in the windows")
for g, n in cnt.most_common(25): print(f"{g:30s} {n:6d} {100*n/N:5.1f}%")
for g in ['controld', 'guestd', 'desktop:Xvfb', 'desktop:xterm', 'desktop:openbox', 'client']:
    if not cnt[g]: continue
    print(f"== {g}: {cnt[g]} samples; inclusive")
    for s, n in incl[g].most_common(45): print(f"   {100*n/cnt[g]:5.1f}% {s}")
    print(f"-- {g} self")
    for s, n in self_[g].most_common(15): print(f"   {100*n/cnt[g]:5.1f}% {s}")
