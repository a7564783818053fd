"""The training loop's stages, in the order `mmrl.trainer` runs them: `collect` (with `rollout` and
`rollout_workers`), `shaping`, `old_scores`, `advantages`, `update` (with `batching`); `evaluate` for held-out
evaluation. Each stage takes the pieces it works on, never the whole run; the map of the code is docs/design.md."""
