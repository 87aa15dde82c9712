"""Runs inside the vLLM server process (its own virtualenv, no rollstream imports): the worker extension.

The server is started with ``--worker-extension-cls rollstream_vllm.WorkerExtension`` and this folder on its
``PYTHONPATH``; ``POST /collective_rpc {"method": "rollstream_reload", "args": [folder]}`` then calls
``WorkerExtension.rollstream_reload`` on every worker.

Why not vLLM's own ``reload_weights``: on CPU, the output layer multiplies with a packed copy of its weight made
at load time. With tied input/output embeddings the checkpoint has no ``lm_head.weight``, so a reload updates the
embedding but never re-packs the output layer, and logits keep coming from the old weights. Re-packing every
embedding-shaped linear after the reload fixes it (untied heads are re-packed twice, which is cheap).
"""

from __future__ import annotations

from typing import Any


class WorkerExtension:
    """Mixed into vLLM's worker class; ``self`` is the worker."""

    def rollstream_reload(self, weights_path: str) -> str:
        from vllm.model_executor.layers.vocab_parallel_embedding import VocabParallelEmbedding

        worker: Any = self
        worker.reload_weights(weights_path=weights_path)
        model = worker.model_runner.get_model()
        for module in model.modules():
            if isinstance(module, VocabParallelEmbedding) and hasattr(module, "cpu_linear"):
                module.quant_method.process_weights_after_loading(module)
        return weights_path
