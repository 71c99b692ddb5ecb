# The main job's testpmd command line, sourced by scripts/run.sh (timed, against net_null) and
# scripts/main-callgrind.sh (counted in instructions), so that both measure the same job: EAL
# arguments before the --vdev ones, application arguments after `--`.
main_job_eal=(-l 0-1 --no-huge -m 512 --no-pci)
main_job_app=(-i --forward-mode=txonly --txpkts=64 --burst=32 --total-num-mbufs=16384)
