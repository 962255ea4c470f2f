import json,sys,statistics as st
# usage: abcmp.py order.txt ; pools hit samples of each variant's runs, prints p50 per burst
runs={}
for l in open(sys.argv[1]):
    p=l.split()
    if len(p)>3 and p[1]=='end' and p[3].endswith('.json'): runs.setdefault(p[2],[]).append(p[3])
def cells(files):
    c={}
    for f in files:
        d=json.load(open(f))
        for r in d['rows']:
            lb=r['labels']
            if lb.get('pool')!='checkpoint' or 'burst' not in lb: continue
            b=int(lb['burst'])
            if lb.get('served')=='hit' and r['metric'] in ('pool.claim_server','pool.claim_usable','pool.claim_session'):
                c.setdefault((b,r['metric'][11:]),[]).extend(r.get('samples') or [])
            if r['metric']=='pool.burst_cpu' and lb.get('proc') in ('controld','guestd','desktop','client','all'):
                c.setdefault((b,'cpu_'+lb['proc']),[]).extend(r.get('samples') or [])
            if r['metric']=='pool.burst_hits_wall':
                c.setdefault((b,'hits_wall'),[]).extend(r.get('samples') or [])
    return c
C={v:cells(fs) for v,fs in runs.items()}
vs=list(C)
print('runs:',{v:len(runs[v]) for v in vs})
keys=sorted(set(k for v in vs for k in C[v]))
for k in keys:
    row=[]
    for v in vs:
        s=C[v].get(k,[])
        row.append('%s %.2f (n %d)'%(v,st.median(s),len(s)) if s else v+' -')
    print('burst %d %-12s'%k, ' | '.join(row))
