#!/bin/bash
# run under the bench lock: perf over a checkpoint-pool run on the shared controld
set -u
cd /work/wt/claims5/benchd
tag=$1; shift
uptime > /tmp/claims5/$tag.load
perf record -a -g -F 1999 -k CLOCK_MONOTONIC -e cpu-clock -e sched:sched_switch -e sched:sched_wakeup -o /tmp/claims5/$tag.data -- \
  /work/main/bin/benchd run --suite pool --pool-kinds checkpoint --pool-bursts 1,2,4,8 --n 6 "$@" > /tmp/claims5/$tag.log 2>&1
uptime >> /tmp/claims5/$tag.load
