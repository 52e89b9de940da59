"""How far PPO's ratio is from 1 before an update's first step when the behaviour policy acted in
float32 and the learner evaluates the same weights under bf16 autocast (``precision="bf16-mixed"``).

Plays ``--steps`` random steps of 8 envs of an ALE game, takes the log-probabilities of the actions
under the policy in float32 and under ``torch.autocast("cpu", dtype=torch.bfloat16)``, and prints
``|ratio - 1|`` and the fraction of rows each clip range would clip before any gradient step. With
``--ckpt`` the policy's weights come from a PPO checkpoint (a trained policy's larger logits round
further), else from PPO's initialization.

With ``--after-steps N`` it then takes N Adam steps (``--lr``) of a policy-gradient loss with
random advantages on minibatches of 256 rows under bf16 autocast, and compares two bf16 ratios
with the float32 one of the moved weights: against the float32 actor's ``old_logp`` (what PPO
does) and against ``old_logp`` recomputed by the learner's bf16 forward before the steps.

    python benchmarks/bf16_ratio.py [--env ALE/Breakout-v5] [--steps 64] [--ckpt last.ckpt] \
        [--after-steps 16 --lr 1e-5]

The last stdout line is one JSON object with the figures.
"""

from __future__ import annotations

import argparse
import json

import numpy as np
import torch

from lightning_rl import PPO
from lightning_rl.data.envs import make_vector_env

CLIPS = (0.1, 0.03, 0.02, 0.01, 0.005)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env", default="ALE/Breakout-v5")
    parser.add_argument("--steps", type=int, default=64)
    parser.add_argument("--ckpt", default=None, help="a PPO checkpoint of the same env and network")
    parser.add_argument("--after-steps", type=int, default=0, help="Adam steps before comparing old_logp sources")
    parser.add_argument("--lr", type=float, default=1e-5, help="the Adam steps' learning rate")
    args = parser.parse_args(argv)

    model = PPO(env=args.env, num_envs=8, seed=0, hiddens=[], vf_share_layers=True)  # ppo_atari.yaml's network
    model.setup("fit")
    net = model.policies["default_policy"]
    if args.ckpt:
        prefix = "policies.default_policy."
        state = torch.load(args.ckpt, map_location="cpu", weights_only=True)["state_dict"]
        net.load_state_dict({k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)})
    envs = make_vector_env(args.env, 8, "sync")
    rng = np.random.default_rng(0)
    obs, _ = envs.reset(seed=0)
    frames, actions = [], []
    for _ in range(args.steps):
        act = rng.integers(0, envs.single_action_space.n, 8)
        frames.append(obs)
        actions.append(act)
        obs, *_ = envs.step(act)
    envs.close()
    x, a = torch.as_tensor(np.concatenate(frames)), torch.as_tensor(np.concatenate(actions))
    with torch.no_grad():
        logp32 = net(x)[0].log_prob(a).float()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logp16 = net(x)[0].log_prob(a).float()
    dev = (torch.exp(logp16 - logp32) - 1).abs()
    result = {
        "env": args.env, "rows": len(dev), "ckpt": args.ckpt,
        "abs_ratio_minus_1": {"median": dev.median().item(), "p90": dev.quantile(0.9).item(), "max": dev.max().item()},
        "clipped_before_any_step": {str(c): (dev > c).float().mean().item() for c in CLIPS},
    }
    print(f"{args.env}, {len(dev)} rows, {'weights of ' + args.ckpt if args.ckpt else 'initial weights'}: "
          f"|ratio - 1| median {result['abs_ratio_minus_1']['median']:.4f}, 90th percentile "
          f"{result['abs_ratio_minus_1']['p90']:.4f}, max {result['abs_ratio_minus_1']['max']:.4f}")
    for c in CLIPS:
        print(f"  clip_param {c}: {result['clipped_before_any_step'][str(c)]:.1%} of the rows clipped before any step")
    if args.after_steps:
        result["after_steps"] = _after_steps(net, x, a, logp32, logp16, args.after_steps, args.lr)
        moved = result["after_steps"]
        print(f"after {args.after_steps} Adam steps (lr {args.lr:g}; true |ratio - 1| median "
              f"{moved['true_abs_ratio_minus_1_median']:.4f}), |bf16 ratio - float32 ratio| median / 90th percentile:")
        for source, err in moved["ratio_error"].items():
            print(f"  old_logp {source}: {err['median']:.4f} / {err['p90']:.4f}")
    print(json.dumps(result))
    return result


def _after_steps(net: torch.nn.Module, x: torch.Tensor, a: torch.Tensor, logp32: torch.Tensor,
                 logp16: torch.Tensor, steps: int, lr: float) -> dict:
    gen = torch.Generator().manual_seed(0)
    advantages = torch.randn(len(a), generator=gen)
    optimizer = torch.optim.Adam(net.parameters(), lr=lr, eps=1e-5)
    for _ in range(steps):
        rows = torch.randperm(len(a), generator=gen)[:256]
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = -(advantages[rows] * net(x[rows])[0].log_prob(a[rows]).float()).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    with torch.no_grad():
        new32 = net(x)[0].log_prob(a).float()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            new16 = net(x)[0].log_prob(a).float()
    true = torch.exp(new32 - logp32)
    errors = {"float32 actor": (torch.exp(new16 - logp32) - true).abs(),
              "bf16 recomputed": (torch.exp(new16 - logp16) - true).abs()}
    return {"steps": steps, "lr": lr, "true_abs_ratio_minus_1_median": (true - 1).abs().median().item(),
            "ratio_error": {k: {"median": e.median().item(), "p90": e.quantile(0.9).item()} for k, e in errors.items()}}


if __name__ == "__main__":
    main()
