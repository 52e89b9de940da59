"""Samplers that step envs with a policy into fragments, without Lightning: the engine
(``engine.EnvSampler``) and the multi-agent fragment sampler of the PettingZoo workers."""
