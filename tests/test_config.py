import pytest

from conch.config import Config, ConfigError, describe, load_config


def test_defaults_file_and_overrides(tmp_path):
    f = tmp_path / "c.toml"
    f.write_text('[ppo]\nlr = 0.01\nrouting_replay = false\n[reward]\nmode = "binary"\n')
    cfg = load_config(f, ["ppo.iterations=3", "corpus.families=a,b", "reward.mode=fraction"])
    assert cfg.ppo.lr == 0.01 and cfg.ppo.routing_replay is False
    assert cfg.ppo.iterations == 3 and cfg.corpus.families == ["a", "b"]
    assert cfg.reward.mode == "fraction"  # overrides win over the file


@pytest.mark.parametrize(
    "text, fragment",
    [
        ("[nope]\nx = 1\n", "unknown section [nope]"),
        ("[ppo]\nlrr = 1\n", "unknown key ppo.lrr"),
        ("[ppo]\niterations = 'many'\n", "ppo.iterations: expected an integer"),
        ("[ppo]\niterations = 1.5\n", "expected an integer"),
        ("[reward]\nmode = 'dense'\n", "reward.mode must be one of"),
        ("[ppo\n", "invalid TOML"),
    ],
)
def test_bad_files_name_the_file_and_field(tmp_path, text, fragment):
    f = tmp_path / "bad.toml"
    f.write_text(text)
    with pytest.raises(ConfigError, match=fragment.replace("[", r"\[").replace(".", r"\.")) as ei:
        load_config(f)
    assert str(f) in str(ei.value)


def test_bad_override_syntax():
    with pytest.raises(ConfigError, match="section.key=value"):
        load_config(None, ["iterations=3"])


def test_describe_round_trips_through_toml(tmp_path):
    cfg = load_config(None, ["ppo.lr=0.123", "corpus.families=x"])
    text = describe(cfg)
    assert "# PPO iterations" in text.replace("iterations = 8  # PPO iterations", "# PPO iterations")
    f = tmp_path / "round.toml"
    f.write_text(text)
    again = load_config(f)
    assert again.to_dict() == cfg.to_dict()
    assert Config().to_dict() != cfg.to_dict()


def test_list_overrides_take_toml_arrays_and_commas():
    for text in ('["count-lines", "make-dirs"]', "count-lines, make-dirs", "count-lines,make-dirs"):
        assert load_config(None, [f"corpus.families={text}"]).corpus.families == ["count-lines", "make-dirs"]
    assert load_config(None, ["corpus.families=[]"]).corpus.families == []
    with pytest.raises(ConfigError, match="corpus.families: expected a TOML array"):
        load_config(None, ['corpus.families=["a"'])


def test_unknown_family_fails_at_config_time():
    from conch.rl.train import check_config

    with pytest.raises(ConfigError, match="corpus.families: unknown families nope"):
        check_config(load_config(None, ["corpus.families=count-lines,nope"]))


def test_constraints_live_on_the_fields():
    for override, words in (("ppo.lr=-1", "ppo.lr must be > 0.0"), ("corpus.mistake_rate=1.5", "<= 1.0"),
                            ("ppo.loss_agg=sum", "must be one of token-mean"), ("agent.top_p=0", "> 0.0")):
        with pytest.raises(ConfigError, match=words):
            load_config(overrides=[override])
    assert load_config(overrides=["ppo.lr=3e-5"]).ppo.lr == 3e-5


def test_unknown_keys_get_a_suggestion():
    with pytest.raises(ConfigError, match=r"did you mean ppo\?"):
        load_config(overrides=["ppp.lr=1"])
    with pytest.raises(ConfigError, match=r"did you mean n_per_task\?"):
        load_config(overrides=["ppo.n_per_tsk=2"])


def test_list_fields_are_typed_and_their_elements_coerced(tmp_path):
    cfg = load_config(None, ["corpus.split=0.3,0.5,0.2", "engine.extra_args=--max-model-len,8192"])
    assert cfg.corpus.split == [0.3, 0.5, 0.2] and all(type(v) is float for v in cfg.corpus.split)
    assert cfg.engine.extra_args == ["--max-model-len", "8192"]
    assert load_config(None, ['engine.extra_args=["--max-model-len", 8192]']).engine.extra_args == \
        ["--max-model-len", "8192"]
    assert "split = [0.3, 0.5, 0.2]  #" in describe(cfg)  # numbers in config.toml, not strings
    f = tmp_path / "c.toml"
    f.write_text('[corpus]\nsplit = ["0.2", "0.6", "0.2"]\n')  # what older runs wrote: read back as numbers
    assert load_config(f).corpus.split == [0.2, 0.6, 0.2]
    with pytest.raises(ConfigError, match=r"corpus\.split\[1\]: expected a number"):
        load_config(None, ["corpus.split=0.5,half,0.5"])


@pytest.mark.parametrize("split", ["0.5,0.5", "0.3,0.5,0.3", "-0.2,0.7,0.5", "1,1,1", "0.25,0.25,0.25,0.25", "[]"])
def test_split_must_be_three_shares_summing_to_one(split):
    with pytest.raises(ConfigError, match="corpus.split must be three non-negative shares"):
        load_config(None, [f"corpus.split={split}"])


def test_split_accepts_three_shares_within_rounding():
    assert load_config(None, ["corpus.split=0.3333333,0.3333333,0.3333334"]).corpus.split[2] == 0.3333334
    assert load_config(None, ["corpus.split=0,1,0"]).corpus.split == [0.0, 1.0, 0.0]


def test_retired_key_names_its_replacement_and_old_run_folders_still_load(tmp_path):
    with pytest.raises(ConfigError, match=r"critic.lr .*set ppo.critic_lr"):
        load_config(overrides=["critic.lr=1e-4"])
    old = tmp_path / "config.toml"  # what describe() wrote into run folders while critic.lr existed
    old.write_text("[critic]\nlr = 0.001\niterations = 3\n")
    assert load_config(old).critic.iterations == 3
    old.write_text("[critic]\nlr = 0.02\n")  # a value someone chose: it never had an effect, so say so
    with pytest.raises(ConfigError, match=r"config.toml: critic.lr"):
        load_config(old)
