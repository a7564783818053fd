"""Generation engines for token policies: `lean`, `hf`, `static` (`backends`) and vLLM, colocated or in an engine
process of its own."""
