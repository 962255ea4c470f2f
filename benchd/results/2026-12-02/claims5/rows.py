import json,sys
# one line per hit cell: burst, server/usable p50 (samples), CPU by group p50
for f in sys.argv[1:]:
  d=json.load(open(f))
  print(f"## {f.split('/')[-1]} started {d['started_at'][:19]} load {d['host']['load_before']} -> {d['host']['load_after']}")
  cells={}
  for r in d['rows']:
    l=r['labels']
    if l.get('pool')!='checkpoint' or l.get('served','hit')!='hit' or 'burst' not in l: continue
    c=cells.setdefault(int(l['burst']),{})
    if r['metric'] in ('pool.claim_server','pool.claim_usable'):
      c[r['metric'][11:]]=(r['p50'],r.get('samples') or [])
    if r['metric']=='pool.burst_cpu': c['cpu_'+l['proc']]=r['p50']
  for b in sorted(cells):
    c=cells[b]
    s=lambda k: '%.2f [%s]'%(c[k][0],' '.join('%.1f'%x for x in c[k][1])) if k in c else '-'
    cpu=' '.join('%s %.1f'%(k[4:],c[k]) for k in ('cpu_all','cpu_client','cpu_controld','cpu_guestd','cpu_desktop') if k in c)
    print(f"burst {b}: server p50 {s('server')}; usable p50 {s('usable')}; CPU a burst p50 ms: {cpu}")
