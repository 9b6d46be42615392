"""The HTTP path (``teacher_replay.endpoint.OpenAIEndpoint``) against a real loopback server whose
answers come from the in-process engine: the same text, the same parsed tool calls, the same evaluation
answers; request fields, retries, a server's native ``tool_calls``, and a sandbox rollout driven through
the server from the CLI."""

from __future__ import annotations

import json
import shutil
from types import SimpleNamespace

import pytest

from composer_replication import wire
from composer_replication.generation import Completion, GenerationParams, LocalEngine, tool_calls
from composer_replication.generation.types import action_text
from composer_replication.teacher_replay.client import RetryPolicy
from composer_replication.teacher_replay.endpoint import OpenAIEndpoint, to_completion
from composer_replication.teacher_replay.fake_server import FakeOpenRouter, Reply

MAX_NEW = 12
CALL = wire.format_tool_use("Bash", {"command": "pytest -q"})


@pytest.fixture(scope="module")
def served(tmp_path_factory, tiny_tokenizer):
    """A tiny model saved to a directory, and a loopback server answering with that model (greedy,
    ``MAX_NEW`` tokens) through ``LocalEngine``: a stand-in for ``transformers serve`` of the directory."""
    from composer_replication.models import build_tiny_model, load_model_and_tokenizer, save_tiny_pair

    d = save_tiny_pair(
        tmp_path_factory.mktemp("served"),
        build_tiny_model(tokenizer=tiny_tokenizer, seed=5, initializer_range=0.2),
        tiny_tokenizer,
    )
    model, tok = load_model_and_tokenizer(d)
    engine = LocalEngine(model.eval(), tok)

    def respond(model_name: str, messages: list[dict]) -> str:
        return engine.complete([messages], GenerationParams(max_new_tokens=MAX_NEW))[0].text

    srv = FakeOpenRouter(responder=respond).start()
    yield SimpleNamespace(dir=d, engine=engine, server=srv)
    srv.stop()


def test_the_endpoint_returns_what_the_engine_behind_it_wrote(served):
    convs = [[{"role": "user", "content": f"task {i}: fix the failing test"}] for i in range(3)]
    params = GenerationParams(max_new_tokens=MAX_NEW)
    local = served.engine.complete(convs, params)
    with OpenAIEndpoint(served.server.base_url, "tiny") as ep:
        remote = ep.complete(convs, params)
    assert [r.text for r in remote] == [c.text for c in local] and len({c.text for c in local}) == 3
    assert [tool_calls(r) for r in remote] == [tool_calls(c) for c in local]
    assert all(r.token_ids is None and r.completion_tokens > 0 for r in remote)


def test_the_same_text_gives_the_same_tool_calls_on_both_paths(served):
    """Texts with calls, a malformed call and none, returned verbatim by the server."""
    bad = "[TOOL_USE] name=Edit input={not json"
    texts = [CALL, f"I will run the tests.\n\n{CALL}\n\n{bad}", "Done."]
    with OpenAIEndpoint(served.server.base_url, "x") as ep:
        for text in texts:
            served.server.script = lambda info, text=text: Reply(text=text)
            remote = ep.complete([[{"role": "user", "content": "go"}]], GenerationParams(max_new_tokens=64))[
                0
            ]
            local = Completion(text=text, finish_reason="stop", prompt_tokens=1, completion_tokens=1)
            assert tool_calls(remote) == tool_calls(local) == wire.tool_calls(text)
    served.server.script = None
    assert [c["name"] for c in wire.tool_calls(texts[1])] == ["Bash", "_invalid"]


def test_evaluation_through_the_endpoint_gives_the_in_process_answers(served, tmp_path):
    from composer_replication.trainer.evaluation.greedy import GreedyGenerator

    states = [
        {"state_id": f"s{i}", "messages": [{"role": "system", "content": "You are a coding agent."},
                                           {"role": "user", "content": f"task {i}: the build fails"}]}
        for i in range(3)
    ]  # fmt: skip
    local = GreedyGenerator(served.dir, tmp_path / "a.jsonl", max_new_tokens=MAX_NEW, max_prompt_tokens=400)
    with OpenAIEndpoint(served.server.base_url, "tiny") as ep:
        remote = GreedyGenerator(
            served.dir, tmp_path / "b.jsonl", max_new_tokens=MAX_NEW, max_prompt_tokens=400, engine=ep
        )
        assert [remote(s)[0] for s in states] == [local(s)[0] for s in states]


def test_parameters_travel_as_chat_completion_fields_and_failures_are_retried(served):
    seen = []

    def script(info):
        seen.append(info.body)
        return Reply(kind="http_error", status=429, retry_after="0") if info.n == 1 else Reply(text="ok")

    served.server.script = script
    params = GenerationParams(max_new_tokens=7, temperature=0.5, top_p=0.9, top_k=20, seed=3, stop=("\n\n",),
                              logprobs=True)  # fmt: skip
    tools = [{"type": "function", "function": {"name": "Bash", "parameters": {"type": "object"}}}]
    try:
        with OpenAIEndpoint(served.server.base_url, "m", retry=RetryPolicy(backoff_base_s=0.01),
                            extra_body={"tools": tools}) as ep:  # fmt: skip
            got = ep.complete([[{"role": "user", "content": "retry me"}]], params)
    finally:
        served.server.script = None
    assert got[0].text == "ok" and len(seen) == 2
    body = seen[-1]
    want = {"model": "m", "max_tokens": 7, "temperature": 0.5, "top_p": 0.9, "top_k": 20, "seed": 3,
            "stop": ["\n\n"], "logprobs": True, "tools": tools}  # fmt: skip
    assert {k: body[k] for k in want} == want and "repetition_penalty" not in body


def _response(message: dict, finish: str = "stop", **choice) -> bytes:
    body = {"choices": [{"message": message, "finish_reason": finish, **choice}],
            "usage": {"prompt_tokens": 5, "completion_tokens": 3}}  # fmt: skip
    return json.dumps(body).encode()


def test_native_tool_calls_parse_as_the_same_calls_as_their_text():
    from composer_replication.teacher_replay.backends.openai_compat import parse_response

    native = [
        {
            "id": "c1",
            "type": "function",
            "function": {"name": "Bash", "arguments": '{"command": "pytest -q"}'},
        }
    ]
    resp = parse_response(
        200, {}, _response({"content": "I will run the tests.", "tool_calls": native}, "tool_calls")
    )
    remote = to_completion(resp)
    text = Completion(text=f"I will run the tests.\n\n{CALL}", finish_reason="stop", prompt_tokens=1,
                      completion_tokens=1)  # fmt: skip
    assert action_text(remote) == text.text and tool_calls(remote) == tool_calls(text)
    assert remote.complete and remote.extra["server_finish_reason"] == "tool_calls"
    only = to_completion(parse_response(200, {}, _response({"content": None, "tool_calls": native})))
    assert only.text == "" and tool_calls(only) == [{"name": "Bash", "input": {"command": "pytest -q"}}]
    lp = {"content": [{"token": "a", "logprob": -0.5}, {"token": "b", "logprob": -1.25}]}
    cut = to_completion(parse_response(200, {}, _response({"content": "abc"}, "length", logprobs=lp)))
    assert not cut.complete and cut.logprobs == [-0.5, -1.25]


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap not installed")
def test_a_rollout_driven_through_the_endpoint_from_the_cli(tmp_path):
    """``rollout --policy URL``: the server answers with the task's oracle steps, one per turn."""
    import argparse

    from composer_replication.cli import rollout as rollout_cli
    from composer_replication.datagen import rollout
    from composer_replication.datagen.tasks import bundled_tasks

    steps = rollout.oracle_policy(bundled_tasks()["write_word"]).steps
    seen: list[list[dict]] = []

    def respond(model_name: str, messages: list[dict]) -> str:
        seen.append(messages)
        return steps[min(sum(m["role"] == "assistant" for m in messages), len(steps) - 1)]

    p = argparse.ArgumentParser()
    rollout_cli.add_arguments(p)
    with FakeOpenRouter(responder=respond) as srv:
        args = p.parse_args(["--out", str(tmp_path), "--tasks", "write_word", "--policy", srv.base_url,
                             "--endpoint-model", "served-model"])  # fmt: skip
        assert rollout_cli.run(args) == 0
        assert {k[0] for k in srv.counts} == {"served-model"}
    row = json.loads((tmp_path / "rollouts.jsonl").read_text().splitlines()[0])
    assert (row["status"], row["reward"], row["turns"]) == ("ok", 1.0, len(steps))
    assert seen[0][:2] == rollout.task_prompt(bundled_tasks()["write_word"])
