"""Time ``mfd-hub regen`` engines on the SmolLM2 target, side by side on the same prompts.

Every configuration answers the same training prompts of the miniature
(``mfd_hub.zoo.prompts.derive_training_prompts``) with the same sampling (T = 0.7, top-p 0.8,
top-k 20, at most 192 new tokens by default), in one process. The prompts are split into
``--rounds`` parts and the configurations take turns on each part (the order alternates from
round to round), so a change in machine load reaches all of them alike; the ratios are the
figures to trust on shared cores. A configuration is ``ENGINE:DTYPE:BATCH[xSAMPLES][:LINEARS]``:
the engine (``generate``: transformers generate over static batches, the original engine;
``continuous``: the default engine), ``auto`` / ``float32`` / ``bfloat16``, the batch size, how
many answers it draws per prompt (a continuous batch needs more answers than rows to stay full, as
a real regeneration of thousands of prompts does; the original engine's speed does not depend on
how many batches it runs) and, for the continuous engine, its products (``auto``, the default:
packed oneDNN where they run; ``torch``: torch's own linear layers).

    python benchmarks/regen_speed.py                                   # old vs new, a few minutes
    python benchmarks/regen_speed.py --configs continuous:float32:128x8:torch continuous:float32:128x8 --prompts 32
    python benchmarks/regen_speed.py --configs generate:float32:8 generate:float32:64 \\
        continuous:float32:32 continuous:float32:64x4 continuous:bfloat16:64x4 --prompts 32 --rounds 2
"""

import argparse
import json
import time

import torch

from mfd_hub.precision import dtype_name, resolve_dtype
from mfd_hub.packed_linear import LINEARS
from mfd_hub.recipes.regen import _encode, local_engine
from mfd_hub.targets import load_target
from mfd_hub.zoo.prompts import derive_training_prompts

DEFAULT_CONFIGS = ("generate:float32:8", "continuous:auto:64x4")


def parse_config(spec):
    """``ENGINE:DTYPE:BATCH[xSAMPLES]`` -> dict."""
    try:
        engine, dtype, rest, *linears = spec.split(":")
        batch, _, samples = rest.partition("x")
        config = {"spec": spec, "engine": engine, "dtype": resolve_dtype(dtype), "batch_size": int(batch),
                  "samples": int(samples or 1), "linears": linears[0] if linears else "auto"}
    except ValueError:
        raise SystemExit(f"error: bad configuration {spec!r}; write ENGINE:DTYPE:BATCH[xSAMPLES][:LINEARS], "
                         "e.g. continuous:auto:64x4") from None
    if (engine not in ("generate", "continuous") or config["batch_size"] < 1 or config["samples"] < 1
            or len(linears) > 1 or config["linears"] not in LINEARS or (engine == "generate" and linears)):
        raise SystemExit(f"error: bad configuration {spec!r}")
    return config


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--configs", nargs="+", default=list(DEFAULT_CONFIGS), help="ENGINE:DTYPE:BATCH[xSAMPLES]")
    parser.add_argument("--prompts", type=int, default=16, help="distinct prompts (default 16)")
    parser.add_argument("--offset", type=int, default=0, help="skip this many training prompts first")
    parser.add_argument("--rounds", type=int, default=2, help="turns the prompts are split into (default 2)")
    parser.add_argument("--max-new-tokens", type=int, default=192)
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--top-p", type=float, default=0.8)
    parser.add_argument("--top-k", type=int, default=20)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    parser.add_argument("--json", dest="json_path", default=None, help="also write the results here")
    args = parser.parse_args(argv)
    if args.prompts < args.rounds or args.rounds < 1:
        raise SystemExit("error: --prompts must be at least --rounds (and --rounds at least 1)")
    if args.threads:
        torch.set_num_threads(args.threads)
    configs = [parse_config(spec) for spec in args.configs]

    targets = {}
    for config in configs:
        if config["dtype"] not in targets:
            targets[config["dtype"]] = load_target("smollm2", dtype=config["dtype"])
    tokenizer = next(iter(targets.values()))[1]
    texts = derive_training_prompts(args.offset + args.prompts)[args.offset :]
    encoded = [_encode(tokenizer, text, chat=True) for text in texts]
    parts = [encoded[i :: args.rounds] for i in range(args.rounds)]
    print(f"{len(encoded)} prompts ({min(map(len, encoded))}-{max(map(len, encoded))} tokens), {args.rounds} rounds, "
          f"at most {args.max_new_tokens} new tokens, T={args.temperature} top-p {args.top_p} top-k {args.top_k}, "
          f"{torch.get_num_threads()} threads", flush=True)

    results = {config["spec"]: {"answers": 0, "tokens": 0, "seconds": 0.0, "stopped": 0} for config in configs}
    for round_number, part in enumerate(parts):
        order = configs if round_number % 2 == 0 else configs[::-1]
        for config in order:
            model = targets[config["dtype"]][0]
            options = {"linears": config["linears"]} if config["engine"] == "continuous" else {}
            engine = local_engine(model, tokenizer, config["engine"], config["batch_size"], **options)
            jobs = [ids for ids in part for _ in range(config["samples"])]
            seed = 1000 * round_number
            start = time.perf_counter()
            answers = [answer for _, answer in engine.stream(jobs, args.temperature, args.top_p, args.top_k,
                                                             args.max_new_tokens, seed)]
            seconds = time.perf_counter() - start
            tokens = sum(len(response) for response, _ in answers)
            result = results[config["spec"]]
            result["answers"] += len(answers)
            result["tokens"] += tokens
            result["seconds"] += seconds
            result["stopped"] += sum(reason == "stop" for _, reason in answers)
            print(f"  round {round_number + 1}: {config['spec']:<24} {len(answers):4d} answers {tokens:6d} tokens "
                  f"{seconds:7.1f} s  {tokens / seconds:6.1f} tok/s", flush=True)

    base = results[configs[0]["spec"]]
    base_rate = base["tokens"] / base["seconds"]
    print(f"\n{'configuration':<24} {'dtype':<9} {'answers':>7} {'tokens':>7} {'mean len':>8} {'stop':>5} "
          f"{'seconds':>8} {'tok/s':>7} {'ratio':>6}")
    for config in configs:
        result = results[config["spec"]]
        rate = result["tokens"] / result["seconds"]
        result.update(dtype=dtype_name(config["dtype"]), tokens_per_s=round(rate, 2), ratio=round(rate / base_rate, 3))
        print(f"{config['spec']:<24} {result['dtype']:<9} {result['answers']:7d} {result['tokens']:7d} "
              f"{result['tokens'] / result['answers']:8.1f} {result['stopped']:5d} {result['seconds']:8.1f} "
              f"{rate:7.1f} {rate / base_rate:5.2f}x")
    if args.json_path:
        with open(args.json_path, "w", encoding="utf-8") as handle:
            json.dump({"settings": vars(args) | {"threads": torch.get_num_threads()}, "results": results}, handle,
                      indent=2)


if __name__ == "__main__":
    main()
