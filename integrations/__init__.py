"""wmark.integrations: wmark inside other serving stacks (vLLM: `wmark.integrations.vllm`)."""
