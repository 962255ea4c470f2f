import os, time
root='/sys/fs/cgroup/freezer'
a=root+'/claims4-fz-a'; b=root+'/claims4-fz-b'
for d in (a,b):
    os.makedirs(d, exist_ok=True)
def w(d,s):
    with open(d+'/freezer.state','w') as f: f.write(s)
def cycle(d, n=20):
    ts=[]
    for _ in range(n):
        t=time.perf_counter(); w(d,'FROZEN'); t1=time.perf_counter(); w(d,'THAWED'); t2=time.perf_counter()
        ts.append(((t1-t)*1e3,(t2-t1)*1e3))
    ts.sort(key=lambda x:x[1])
    fr=sorted(x[0] for x in ts); th=sorted(x[1] for x in ts)
    return fr[len(fr)//2], th[len(th)//2]
print('alone: freeze %.3f ms thaw %.3f ms (p50)' % cycle(a))
w(b,'FROZEN')
print('with another frozen: freeze %.3f ms thaw %.3f ms (p50)' % cycle(a))
w(b,'THAWED')
print('alone again: freeze %.3f ms thaw %.3f ms (p50)' % cycle(a))
for d in (a,b): os.rmdir(d)
