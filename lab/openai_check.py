"""What a client sends, through the real `openai` client: the model list, a completion, a chat completion and a
streamed chat completion, each by the served name it is given. Exit 1 with the request and the error on any failure.

    .venv-runtime/bin/python lab/openai_check.py --base-url http://10.0.0.1:8000/v1 --model lab-tiny-llama \
        --api-key-file inventories/lab/secrets/vllm-api-key [--json]

Runs in the node runtime (.venv-runtime has the client). scripts/demo prints its lines; the lab tests read --json.
The lab's model has random weights: the texts are noise, the token counts are what is checked (ignore_eos).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

PROMPT = "The quick brown fox"
MESSAGES = [{"role": "system", "content": "You answer briefly."},
            {"role": "user", "content": "What does the quick brown fox jump over?"}]


def check(base_url: str, api_key: str, model: str, max_tokens: int) -> list[dict]:
    """The four requests in order; each result is {request, model, tokens, text, seconds} (stream: also chunks)."""
    import openai

    client = openai.OpenAI(base_url=base_url, api_key=api_key, timeout=120, max_retries=0)
    sampling = {"max_tokens": max_tokens, "temperature": 0, "extra_body": {"ignore_eos": True}}
    results = []

    started = time.monotonic()
    served = [entry.id for entry in client.models.list().data]
    results.append({"request": "GET /v1/models", "models": served, "seconds": time.monotonic() - started})

    started = time.monotonic()
    done = client.completions.create(model=model, prompt=PROMPT, **sampling)
    results.append({"request": "completion", "model": done.model, "tokens": done.usage.completion_tokens,
                    "text": done.choices[0].text, "seconds": time.monotonic() - started})

    started = time.monotonic()
    chat = client.chat.completions.create(model=model, messages=MESSAGES, **sampling)
    results.append({"request": "chat completion", "model": chat.model, "tokens": chat.usage.completion_tokens,
                    "role": chat.choices[0].message.role, "text": chat.choices[0].message.content,
                    "seconds": time.monotonic() - started})

    started = time.monotonic()
    stream = client.chat.completions.create(model=model, messages=MESSAGES, stream=True,
                                            stream_options={"include_usage": True}, **sampling)
    pieces, chunks, usage, streamed_model = [], 0, None, None
    for chunk in stream:
        chunks += 1
        streamed_model = chunk.model
        if chunk.usage is not None:
            usage = chunk.usage.completion_tokens
        for choice in chunk.choices:
            if choice.delta and choice.delta.content:
                pieces.append(choice.delta.content)
    results.append({"request": "streamed chat completion", "model": streamed_model, "tokens": usage,
                    "chunks": chunks, "text": "".join(pieces), "seconds": time.monotonic() - started})
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-url", required=True, help="the API's /v1 URL (a vLLM head or a router)")
    parser.add_argument("--model", required=True, help="the served model name (the plan's served_model_name)")
    parser.add_argument("--api-key-file", required=True, type=Path)
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--json", action="store_true", help="one JSON document instead of lines for a person")
    args = parser.parse_args(argv)
    try:
        results = check(args.base_url, args.api_key_file.read_text().strip(), args.model, args.max_tokens)
    except Exception as exc:  # noqa: BLE001 - the client's errors are many; each is reported the same way
        print(f"openai_check: {args.base_url} (model {args.model}): {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(results))
        return 0
    print(f"  served models: {', '.join(results[0]['models'])}")
    for result in results[1:]:
        extra = f", {result['chunks']} chunks" if "chunks" in result else ""
        print(f"  {result['request']} ({result['tokens']} tokens{extra}, {result['seconds']:.2f} s, random weights): "
              f"{result['text']!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
