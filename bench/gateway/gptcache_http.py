"""GPTCache behind HTTP the way its own server (`gptcache_server.server`) serves it: `/get` and `/put`.

Run by bench/gateway/bench_hit_path.py as `python bench/gateway/gptcache_http.py PORT DATA_DIR COSINE`. GPTCache 0.1.44's
server module cannot be imported beside openai>=1 (its OpenAI adapter needs openai<1), so its two cache
endpoints are restated here as it writes them: FastAPI, an `async def` route calling GPTCache's blocking
`get` / `put` with the global cache. GPTCache runs offline only with an embedding function passed in: this
one is sentence-transformers' MiniLM, the model kvgate embeds with, on torch (what GPTCache's `SBERT`
embedding runs). Storage: sqlite + FAISS.
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np
import uvicorn
from fastapi import FastAPI
from pydantic import BaseModel
from sentence_transformers import SentenceTransformer


def main(port: int, folder: str, cosine: float) -> None:
    from gptcache import Config, cache
    from gptcache.adapter.api import get, put
    from gptcache.manager import CacheBase, VectorBase, get_data_manager
    from gptcache.processor.pre import get_prompt
    from gptcache.similarity_evaluation.distance import SearchDistanceEvaluation

    from semantic.embedding.embedder_source import packaged_model_dir

    model = SentenceTransformer(str(packaged_model_dir()), device="cpu", local_files_only=True)

    def embedding_func(text: str, **_: Any) -> np.ndarray:
        vector = model.encode([text], normalize_embeddings=True, show_progress_bar=False)[0]
        return np.asarray(vector, dtype=np.float32)

    data_manager = get_data_manager(
        # GPTCache writes last_access on every hit; under concurrency sqlite's 5 s lock wait runs out.
        CacheBase("sqlite", sql_url=f"sqlite:///{folder}/cache.db?timeout=120"),
        VectorBase("faiss", dimension=384, index_path=f"{folder}/faiss.index", top_k=1),
        max_size=100_000,
    )
    cache.init(
        pre_embedding_func=get_prompt,
        embedding_func=embedding_func,
        data_manager=data_manager,
        similarity_evaluation=SearchDistanceEvaluation(),
        config=Config(similarity_threshold=(cosine + 1) / 2),  # its distance score -> cosine on unit vectors
    )
    app = FastAPI()

    @app.get("/")
    async def hello() -> str:
        return "hello gptcache server"

    @app.post("/put")
    async def put_cache(cache_data: CacheData) -> str:
        put(cache_data.prompt, cache_data.answer)
        return "successfully update the cache"

    @app.post("/get")
    async def get_cache(cache_data: CacheData) -> CacheData:
        return CacheData(prompt=cache_data.prompt, answer=get(cache_data.prompt))

    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")


class CacheData(BaseModel):
    prompt: str
    answer: str | None = ""


if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[2], float(sys.argv[3]))
