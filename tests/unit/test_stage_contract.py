"""The stage contract: a stage's fingerprint covers exactly the settings it declares, the
pipeline refuses what another layout made, and a stage cannot read what it did not declare."""

from __future__ import annotations

import json

import pytest
from pydantic import create_model

from hanlm import pipeline
from hanlm.config import Config, load_config
from hanlm.errors import UserError
from hanlm.stages.stage import UndeclaredRead, declared_view

NAMES = [*pipeline.STAGES, "demo"]


def fingerprinted() -> list[str]:
    """The stages whose outputs are recognised by fingerprint (not rebuilt every time, not a
    rerun of the pipeline)."""
    return [
        n
        for n in NAMES
        if pipeline.declaration(n).writes != "always" and pipeline.declaration(n).rerun is None
    ]


def planned_fingerprints(cfg: Config) -> dict[str, str]:
    """Every stage's fingerprint as the pipeline composes it, upstream first, with no inputs
    from outside the run."""
    fps: dict[str, str] = {}

    def fp(name: str) -> str:
        if name not in fps:
            stage = pipeline.declaration(name)
            upstream = {u: fp(u) for u in pipeline.upstream_of(stage, cfg)}
            fps[name] = pipeline.fingerprint_of(stage, cfg, upstream, None)
        return fps[name]

    for name in fingerprinted():
        fp(name)
    return fps


def downstream(names: set[str], cfg: Config) -> set[str]:
    found = set(names)
    grew = True
    while grew:
        grew = False
        for name in fingerprinted():
            if name not in found and found & set(
                pipeline.upstream_of(pipeline.declaration(name), cfg)
            ):
                found.add(name)
                grew = True
    return found


def with_new_field(cfg: Config, section: str) -> Config:
    """`cfg` whose `section` has one more field, as a newcomer would add one."""
    model = type(getattr(cfg, section))
    grown = create_model(f"{model.__name__}Grown", __base__=model, added_field=(int, 7))
    return cfg.model_copy(
        update={section: grown(**getattr(cfg, section).model_dump(exclude_unset=True))}
    )


def sections_read() -> set[str]:
    return {name.split(".")[0] for n in fingerprinted() for name in pipeline.declaration(n).reads}


@pytest.mark.parametrize("section", sorted(sections_read()))
def test_a_new_field_changes_the_stages_that_read_its_section_and_theirs_only(section):
    cfg = load_config("demo")
    before = planned_fingerprints(cfg)
    grown = with_new_field(cfg, section)
    after = planned_fingerprints(grown)
    changed = {n for n in before if before[n] != after[n]}
    readers = {n for n in fingerprinted() if section in pipeline.declaration(n).reads}
    assert changed == downstream(readers, cfg), (section, sorted(changed))


def test_a_field_read_alone_changes_only_its_readers():
    cfg = load_config("demo")
    before = planned_fingerprints(cfg)
    # the plan reads tokenizer.vocab_size; a new [tokenizer] field is the tokenizer's, not the plan's
    after = planned_fingerprints(with_new_field(cfg, "tokenizer"))
    assert after["plan"] == before["plan"] and after["tokenizer"] != before["tokenizer"]
    # changing the field it reads does change the plan
    vocab = cfg.model_copy(
        update={
            "tokenizer": cfg.tokenizer.model_copy(
                update={"vocab_size": cfg.tokenizer.vocab_size * 2}
            )
        }
    )
    assert planned_fingerprints(vocab)["plan"] != before["plan"]


def test_unfingerprinted_fields_change_nothing():
    cfg = load_config("demo")
    before = planned_fingerprints(cfg)
    placed = cfg.model_copy(
        update={
            "data_engine": cfg.data_engine.model_copy(update={"workers": 7}),
            "logging": cfg.logging.model_copy(update={"log_every": 3}),
            "checkpoint": cfg.checkpoint.model_copy(update={"resume": "never"}),
        }
    )
    after = planned_fingerprints(placed)
    # the plan estimates the data stages' time from the workers, and preflight measures saves
    # against the checkpoint settings: they read these on purpose
    assert {n for n in before if after[n] != before[n]} == {"plan", "preflight"}


def test_every_stage_declares_sections_that_exist():
    sections = set(Config.model_fields)
    for name in NAMES:
        stage = pipeline.declaration(name)
        for read in stage.reads:
            section, _, field = read.partition(".")
            assert section in sections, (name, read)
            if field:
                assert field in type(getattr(Config(), section)).model_fields, (name, read)
        for upstream in stage.after:
            assert upstream in pipeline.STAGES, (name, upstream)
            assert list(pipeline.STAGES).index(upstream) < list(pipeline.STAGES).index(name)


def test_reading_an_undeclared_section_names_the_missing_declaration():
    cfg = load_config("demo")
    view = declared_view(cfg, pipeline.declaration("tokenizer"))
    assert view.tokenizer.vocab_size == cfg.tokenizer.vocab_size
    assert view.run.seed == cfg.run.seed  # a field read alone
    with pytest.raises(UndeclaredRead, match=r"stage tokenizer read \[pretrain\]"):
        _ = view.pretrain.seq_len
    decontam = declared_view(cfg, pipeline.declaration("decontam"))
    assert decontam.corpus.min_chars == cfg.corpus.min_chars
    with pytest.raises(UndeclaredRead, match=r"stage decontam read corpus.inputs"):
        _ = decontam.corpus.inputs


def test_a_folder_from_an_earlier_layout_gets_one_clear_message(tmp_path):
    run = tmp_path / "run"
    (run / "tokenizer").mkdir(parents=True)
    # a marker as hanlm wrote it before stages declared a version
    (run / "tokenizer" / "stage.json").write_text(
        json.dumps({"stage": "tokenizer", "fingerprint": "0123456789abcdef"})
    )
    with pytest.raises(UserError) as caught:
        pipeline.run_stage("tokenizer", load_config("demo"), run)
    message = caught.value.message
    assert "tokenizer" in message and "earlier layout" in message
    assert "--from tokenizer" in message and "new run folder" in message
    assert (run / "tokenizer" / "stage.json").is_file()  # nothing replaced unasked


def test_a_stages_options_are_its_dataclass_and_an_unknown_one_is_refused():
    """run_stage's keywords become the dataclass the stage declares: typed for its hooks, and a
    name it does not take is a caller's mistake named at once."""
    from hanlm.pipeline import declaration, stage_options
    from hanlm.stages.decontam import DecontamOptions
    from hanlm.stages.pretrain import PretrainOptions
    from hanlm.stages.stage import NoOptions

    assert stage_options(declaration("pretrain"), {"stop_after_steps": 4}) == PretrainOptions(4)
    merge = stage_options(declaration("decontam"), {"merge": True})
    assert merge == DecontamOptions(merge=True) and merge.shard is None
    assert stage_options(declaration("corpus")) == NoOptions()
    with pytest.raises(TypeError, match="stage pretrain takes no such option"):
        stage_options(declaration("pretrain"), {"stop_after": 4})
