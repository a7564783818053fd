"""Stateful methods that plug into the stages: the critic's value head, TTRV votes and GRPO-CARE's EMA reference
(`consistency`), SRPO's progress rewards, a judge model, the curriculum. Their pure tensor maths is `mmrl.algos`'s."""
