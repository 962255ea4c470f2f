#!/bin/bash
cd /work/main
for r in 1 2; do
  if [ $r = 1 ]; then order="main new"; else order="new main"; fi
  for v in $order; do
    deploy/controld-up.sh /tmp/popab/c$v/controld > /dev/null 2>&1 || echo "controld-up $v failed"
    sleep 2
    /tmp/popab/benchd run --suite fork --fork-ns 1 --fork-shape-ns 4,8 --fork-restore lazy --fork-lazy-ns 1 --fork-reps 3 --fork-podman=false --fork-ksm-wait 0 --out /tmp/popab/lazy/$v-r$r > /tmp/popab/lazy/$v-r$r.log 2>&1
    echo "$v r$r rc=$? load=$(cut -d' ' -f1 /proc/loadavg)" >> /tmp/popab/lazy/runs.txt
  done
done
deploy/controld-up.sh /tmp/popab/cmain/controld > /dev/null 2>&1
