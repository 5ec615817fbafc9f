"""JobConfig: TOML + section.key=value overrides; every mistake names field, value and fix."""
from __future__ import annotations

import pytest

from trainops.trainer.config import ConfigError, JobConfig, load_config


def test_overrides_are_coerced_by_the_field_type():
    cfg = load_config(None, "tiny", ["training.steps=7", "training.lr=1e-3", "training.compile=true",
                                     "faults.crash_step=3", "faults.crash_step=none"])
    assert (cfg.training.steps, cfg.training.lr, cfg.training.compile) == (7, 1e-3, True)
    assert cfg.faults.crash_step is None


def test_compile_is_true_false_or_auto_and_defaults_to_auto():
    assert load_config(None, "tiny", []).training.compile == "auto"
    assert [load_config(None, "tiny", [f"training.compile={value}"]).training.compile
            for value in ("AUTO", "False", "true")] == ["auto", False, True]
    with pytest.raises(ConfigError, match=r"training.compile = 'maybe' is not valid: expected true, false or auto"):
        load_config(None, "tiny", ["training.compile=maybe"])


def test_to_toml_reads_back_to_an_equal_config(tmp_path):
    cfg = load_config(None, "small", ["parallel.data_parallel=ddp", "model.n_layers=2",
                                      "data.path=/tmp/a \"quoted\" file.txt"])
    path = tmp_path / "job.toml"
    path.write_text(cfg.to_toml())
    assert load_config(path) == cfg


def test_explicit_dims_override_the_preset_and_rope_covers_seq_len():
    cfg = load_config(None, "tiny", ["model.n_layers=2", "training.seq_len=512"])
    args = cfg.model_args()
    assert (args.n_layers, args.dim, args.max_seq_len) == (2, 128, 512)


@pytest.mark.parametrize("override, expected", [
    ("training.stepz=3", "unknown key training.stepz; keys of section 'training' are"),
    ("train.steps=3", "unknown section 'train'"),
    ("steps=3", "is not section.key=value"),
    ("training.precision=fp16", "training.precision = 'fp16' is not valid: Input should be 'fp32' or 'bf16'"),
    ("checkpoint.mode=later", "checkpoint.mode = 'later' is not valid"),
    ("training.steps=abc", "training.steps = 'abc' is not valid: Input should be a valid integer"),
    ("training.steps=0", "training.steps = '0' is not valid: Input should be greater than or equal to 1"),
    ("model.preset=huge", "unknown preset 'huge'; use one of"),
    ("training.global_batch=6", "training.global_batch (6) must be a multiple of training.micro_batch (4)"),
    ("model.n_heads=3", "model.dim (128) must be divisible by model.n_heads (3)"),
])
def test_a_bad_override_is_rejected_naming_field_value_and_fix(override, expected):
    with pytest.raises(ConfigError) as error:
        load_config(None, None, [override])
    assert expected in str(error.value)


def test_a_bad_toml_key_names_the_file_and_the_key(tmp_path):
    path = tmp_path / "job.toml"
    path.write_text("[training]\nsteps = 5\nbatch = 3\n")
    with pytest.raises(ConfigError, match=r"job.toml: unknown key training.batch"):
        load_config(path)


def test_a_toml_value_of_the_wrong_type_is_rejected(tmp_path):
    path = tmp_path / "job.toml"
    path.write_text('[parallel]\ntp = "two"\n')
    with pytest.raises(ConfigError, match=r"parallel.tp = 'two' is not valid"):
        load_config(path)


def test_a_missing_config_file_says_so():
    with pytest.raises(ConfigError, match="does not exist"):
        load_config("/nonexistent/job.toml")


def test_every_field_is_documented():
    for section in JobConfig.model_fields.values():
        for name, field in section.annotation.model_fields.items():
            assert field.description, name
