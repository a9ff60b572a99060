"""Core records validate themselves and say what is wrong."""

import pytest

from ludic.inference.request import ChatCompletionRequest
from ludic.inference.sampling import InferenceSpec, SamplingConfig
from ludic.training.types import ActorTokenLogps, RolloutRequest, SampleAttachments, SAWItem
from ludic.types import ChatResponse, Rollout, Step, TokenTrace, validate_messages


def _step(index: int, reward: float) -> Step:
    return Step(index, "obs", "act", None, reward, False, index == 1)


def test_rollout_total_reward_and_length():
    rollout = Rollout(steps=[_step(0, 0.5), _step(1, 1.0)])
    assert rollout.total_reward == 1.5
    assert rollout.length == 2
    assert len(rollout.id) == 32 and Rollout().id != rollout.id


def test_step_positional_field_order_matches_api_notes():
    step = Step(3, "prev", "raw text", "next", 0.25, True, False)
    assert (step.index, step.prev_obs, step.action, step.next_obs) == (3, "prev", "raw text", "next")
    assert (step.reward, step.truncated, step.terminated, step.info, step.trace) == (
        0.25,
        True,
        False,
        {},
        None,
    )


def test_token_trace_rejects_logprob_count_mismatch():
    with pytest.raises(ValueError, match="completion_logprobs has 1 entries, completion_token_ids 2"):
        TokenTrace([1], [2, 3], [-0.1])


def test_chat_response_to_trace_copies_token_ids():
    response = ChatResponse("hi", "stop", [1, 2], [3], [-0.5])
    trace = response.to_trace()
    assert trace == TokenTrace([1, 2], [3], [-0.5], "stop")
    assert ChatResponse("no ids").to_trace() is None


@pytest.mark.parametrize(
    ("messages", "match"),
    [
        ([], "non-empty list"),
        (["hi"], r"messages\[0\] must be a dict"),
        ([{"role": "robot", "content": "x"}], r"messages\[0\]\['role'\] must be one of"),
        ([{"role": "user", "content": 3}], r"messages\[0\]\['content'\] must be a str"),
    ],
)
def test_malformed_messages_are_rejected_naming_the_field(messages, match):
    with pytest.raises(ValueError, match=match):
        validate_messages(messages)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"temperature": -1.0}, "temperature"),
        ({"temperature": float("nan")}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"stop": [""]}, "stop"),
        ({"seed": 1.5}, "seed"),
    ],
)
def test_sampling_config_rejects_out_of_range_values(kwargs, field):
    with pytest.raises(ValueError, match=f"SamplingConfig.{field}"):
        SamplingConfig(**kwargs)


def test_sampling_config_round_trips_through_dict():
    cfg = SamplingConfig(temperature=0.7, top_p=0.9, max_tokens=12, stop="\n", seed=4)
    assert cfg.stop == ("\n",)
    assert SamplingConfig.from_dict(cfg.to_dict()) == cfg
    spec = InferenceSpec(sampling=cfg)
    assert InferenceSpec.from_dict(spec.to_dict()) == spec
    assert cfg.with_seed(9).seed == 9 and cfg.with_seed(9).temperature == 0.7


def test_chat_completion_request_validates_prompt_ids():
    msgs = [{"role": "user", "content": "hi"}]
    assert ChatCompletionRequest(model="m", messages=msgs, prompt_token_ids=[1, 2]).prompt_token_ids == [1, 2]
    with pytest.raises(ValueError, match="prompt_token_ids"):
        ChatCompletionRequest(model="m", messages=msgs, prompt_token_ids=[1, -2])


def test_saw_item_names_the_mismatched_field():
    with pytest.raises(ValueError, match="action_mask has 2 entries, input_ids 3"):
        SAWItem([1, 2, 3], [1, 1, 1], [0, 1], 1.0, {"rollout_id": "r", "step_index": 0})


def test_saw_item_rejects_nan_weight_and_wrong_actor_logp_count():
    with pytest.raises(ValueError, match="weight must be a finite number"):
        SAWItem([1, 2], [1, 1], [0, 1], float("nan"))
    with pytest.raises(ValueError, match="actor_logps has 2 entries, action_mask marks 1"):
        SAWItem([1, 2], [1, 1], [0, 1], 1.0, attachments=SampleAttachments(ActorTokenLogps([-0.1, -0.2])))


def test_actor_token_logps_validates_its_type():
    with pytest.raises(TypeError, match="token_logps must be a list of floats"):
        ActorTokenLogps(["a"])  # type: ignore[list-item]


def test_rollout_request_rejects_zero_episodes():
    from ludic.training.types import EnvSpec, ProtocolSpec

    with pytest.raises(ValueError, match="num_episodes"):
        RolloutRequest(EnvSpec("e"), ProtocolSpec("p"), num_episodes=0)
