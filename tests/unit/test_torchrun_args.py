"""`hanlm torchrun` reads torchrun's own options with torchrun's parser, but leaves the
script's arguments alone: hanlm's `--run DIR` is no abbreviation of torchrun's `--run-path`."""

from __future__ import annotations

import pytest

from hanlm.launch import torchrun

ARGV = ["--nproc-per-node", "2", "--max-restarts", "0", "-m", "hanlm", "sft", "--run", "runs/x"]


def test_the_scripts_run_flag_reaches_the_script():
    args = torchrun.parse_args(ARGV)
    assert args.nproc_per_node == "2" and args.max_restarts == 0 and args.module
    assert args.training_script == "hanlm"
    assert args.training_script_args == ["sft", "--run", "runs/x"]
    assert not args.run_path


def test_plain_torchrun_reads_it_as_its_own_option(capsys):
    from torch.distributed.run import parse_args

    with pytest.raises(SystemExit):
        parse_args(ARGV)
    assert "ambiguous option: --run" in capsys.readouterr().err
