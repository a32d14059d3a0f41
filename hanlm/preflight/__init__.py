"""`hanlm preflight`: measure the hosts a run will use and say GO or NO-GO before training.

Run it where training will run, with the same launcher:

    torchrun --nproc_per_node N [--nnodes ... --rdzv-endpoint HOST:PORT] -m hanlm preflight --run-dir DIR

or alone (one process: every visible GPU is tested, collectives are not). It checks

- rendezvous: every rank joins within `preflight.timeout_s`, else the report names the
  MASTER_ADDR:MASTER_PORT nobody answered at;
- devices (devices.py): count, name, memory, compute capability (FP8 needs 8.9), driver, and a
  matmul against the catalogue peak;
- collectives (collectives.py): all-reduce, all-gather, reduce-scatter verified and timed (bus
  bandwidth), and the planned model's communication per step against its compute;
- storage (storage.py): at the checkpoint folder (the run's pretraining checkpoints or
  --checkpoint-dir; one rank per host): write throughput with fsync, fsync latency, read-back, free space against
  the checkpoint size, save time against the checkpoint interval;
- shared (shared.py): under torchrun, that every host sees the same checkpoint folder;
- data (data.py): tokens/s from the run's shards against what a step needs (skipped without shards);
- trackers: the experiment trackers of [logging] are installed and logged in (train/trackers.py).

verdict.py turns the measurements into findings, each with a reason and a fix; rank 0 writes
the report (the path it is given: a run's preflight/preflight.json) atomically and prints the table (table.py); `hanlm preflight`
exits 0 for GO, 69 for NO-GO (hanlm.exit_status.HOST_REJECTED: launchers give the host back
and try another).
The checks run from `run.check` (run.py); report.py declares the report's shape, importable
without torch. As a pipeline stage (hanlm.stages.preflight), a NO-GO stops with `PreflightNoGo` (a UserError; exit status 69)
unless preflight.fail_on_no_go is false.

Fault injection for tests (environment variables, read by every rank):
  HANLM_FAULT_SLOW_DISK_S=SECONDS   sleep that long on every storage write (a slow disk)
  HANLM_FAULT_FREE_BYTES=N          the checkpoint file system reports N bytes free (a full disk)
  HANLM_FAULT_COLLECTIVE_ZEROS=R    ranks R ("1", "0,1" or "all") get zeros from every collective
                                    (the consumer-GPU peer-to-peer bug)
"""
