"""``ServerConfig``: the CLI's flags and the dataclass agree, both ways."""

from __future__ import annotations

import pytest

from reference_server.cli import parse_args
from reference_server.config import ServerConfig


def test_no_flags_give_the_dataclass_defaults() -> None:
    assert parse_args([]) == ServerConfig()
    assert ServerConfig().to_argv() == []


def test_flags_parse_into_the_config_and_back() -> None:
    config = ServerConfig(mode="disaggregated", preset="tiny", port=9001, max_num_seqs=4,
                          kv_cache_mb=1.5, max_model_len=128, static_finished="idle",
                          prefill_cpus="0-1", decode_workers=2, prefill_nice=0)  # fmt: skip
    argv = config.to_argv()
    assert "--kv-cache-mb" in argv and "--block-size" not in argv  # defaults are left out
    assert parse_args(argv) == config


def test_the_api_key_is_read_from_the_named_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOADLAB_TEST_CONFIG_KEY", "s3cret")
    config = parse_args(["--api-key-env", "LOADLAB_TEST_CONFIG_KEY"])
    assert config.api_key() == "s3cret" and "s3cret" not in repr(config)
    assert ServerConfig().api_key() is None


def test_kv_budget_is_blocks_or_mib_not_both() -> None:
    with pytest.raises(ValueError, match="at most one"):
        ServerConfig(kv_cache_mb=8.0, num_kv_blocks=64)
    with pytest.raises(SystemExit):
        parse_args(["--kv-cache-mb", "8", "--num-kv-blocks", "64"])
