"""The umT5 text path in JAX: encoder, both checkpoint layouts, tokenizer, encode-prompts, generate.

Oracles: transformers' UMT5EncoderModel (fp32, random tiny configs, padding masks) and its
T5Tokenizer on a SentencePiece model trained on the fly; the XXL parameter count of transformers'
model built on the meta device; Wan's checkpoint names as its public `wan/modules/t5.py` defines them.
"""

from __future__ import annotations

import hashlib
import io
import json

import numpy as np
import pytest
import torch
from safetensors.numpy import load_file

transformers = pytest.importorskip("transformers")
spm = pytest.importorskip("sentencepiece")

from rynn_jax.errors import InputError, UsageError  # noqa: E402
from rynn_jax.models import umt5  # noqa: E402
from rynn_jax.models.umt5_weights import hf_config_dict, load_umt5, umt5_params_from_state_dict  # noqa: E402
from rynn_jax.text_encoder import TextEncoder, bucket, load_text_encoder  # noqa: E402
from rynn_jax.tokenizer import UMT5Tokenizer, clean_prompt, find_tokenizer  # noqa: E402
from rynn_jax.weights import ConversionError  # noqa: E402

RTOL = 1e-5
# A small square config with umT5's real bucketing, and an odd one (attention width ≠ model width,
# 3 heads of 5, 10 buckets). Its width 24 is the tiny DiT's text_dim.
CONFIGS = {
    "square": umt5.UMT5Config(vocab_size=256, dim=32, num_heads=4, head_dim=8, ffn_dim=64, num_layers=2),
    "odd": umt5.UMT5Config(vocab_size=97, dim=24, num_heads=3, head_dim=5, ffn_dim=40, num_layers=3,
                           num_buckets=10),
}
PROMPTS = ["pick up the red block and put it in the bowl", "open the lid", "Öffne die Schublade",
           "把杯子放在桌子上", "wipe  the\ttable &amp;amp; stack the cups", ""]


def wan_name(hf: str) -> str:
    """Wan's name (wan/modules/t5.py: T5Encoder) of a UMT5EncoderModel tensor."""
    if hf == "shared.weight":
        return "token_embedding.weight"
    if hf == "encoder.final_layer_norm.weight":
        return "norm.weight"
    _, _, i, _, layer, rest = hf.split(".", 5)
    table = {"0.layer_norm.weight": "norm1.weight", "1.layer_norm.weight": "norm2.weight",
             "0.SelfAttention.relative_attention_bias.weight": "pos_embedding.embedding.weight",
             "1.DenseReluDense.wi_0.weight": "ffn.gate.0.weight", "1.DenseReluDense.wi_1.weight": "ffn.fc1.weight",
             "1.DenseReluDense.wo.weight": "ffn.fc2.weight",
             **{f"0.SelfAttention.{p}.weight": f"attn.{p}.weight" for p in "qkvo"}}
    return f"blocks.{i}.{table[f'{layer}.{rest}']}"


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """Per config: the transformers model (weights rounded to bf16, as Wan's file is) and the same
    weights written in both layouts under their real names, plus a tokenizer beside the Wan file."""
    root = tmp_path_factory.mktemp("umt5")
    tok_dir = root / "google" / "umt5-xxl"
    tok_dir.mkdir(parents=True)
    corpus = [p for p in PROMPTS if p] + ["hand over the apple to the left hand", "stack the green cups"]
    model_file = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(corpus * 20), model_writer=model_file, vocab_size=60,
                                   hard_vocab_limit=False, model_type="unigram", pad_id=0, eos_id=1, unk_id=2,
                                   bos_id=-1, character_coverage=1.0, minloglevel=2)
    (tok_dir / "spiece.model").write_bytes(model_file.getvalue())
    out = {}
    for name, cfg in CONFIGS.items():
        torch.manual_seed(len(name))
        ref = transformers.UMT5EncoderModel(transformers.UMT5Config(**hf_config_dict(cfg))).eval()
        with torch.no_grad():
            for p in ref.parameters():
                p.copy_(p.bfloat16().float())
        hf_dir = root / f"{name}_hf"
        ref.save_pretrained(hf_dir)
        wan = {wan_name(k): v.bfloat16() for k, v in ref.state_dict().items() if k != "encoder.embed_tokens.weight"}
        torch.save(wan, root / f"{name}_models_t5_umt5-xxl-enc-bf16.pth")
        out[name] = (ref, hf_dir, root / f"{name}_models_t5_umt5-xxl-enc-bf16.pth")
    return root, tok_dir, out


def reference(ref, ids_bl: np.ndarray, lengths_b: np.ndarray) -> np.ndarray:
    mask = np.arange(ids_bl.shape[1])[None] < lengths_b[:, None]
    with torch.no_grad():
        return ref(input_ids=torch.as_tensor(ids_bl, dtype=torch.long),
                   attention_mask=torch.as_tensor(mask, dtype=torch.long)).last_hidden_state.numpy()


def assert_close(ours: np.ndarray, want: np.ndarray) -> None:
    err = np.abs(ours - want).max() / np.abs(want).max()
    assert err <= RTOL, f"relative error {err:.2e}"


@pytest.mark.parametrize("name", sorted(CONFIGS))
@pytest.mark.parametrize("layout", ["hf", "wan"])
def test_both_layouts_load_and_match_transformers_with_padding(checkpoints, name, layout):
    _, _, models = checkpoints
    ref, hf_dir, pth = models[name]
    model = load_umt5(hf_dir if layout == "hf" else pth, dtype="float32")
    assert model.cfg == CONFIGS[name]  # the architecture read off the shapes
    rng = np.random.default_rng(1)
    lengths = np.array([37, 20, 1], np.int32)  # right-padded rows, one a lone token
    ids = rng.integers(0, CONFIGS[name].vocab_size, (3, 37)).astype(np.int32)
    want = reference(ref, ids, lengths)
    ours = np.asarray(model(ids, lengths))
    for b, n in enumerate(lengths):
        assert_close(ours[b, :n], want[b, :n])


def test_every_checkpoint_key_is_accounted_for(checkpoints):
    _, _, models = checkpoints
    ref, _, _ = models["square"]
    sd = {k: v.numpy() for k, v in ref.state_dict().items()}  # both tied names, as older files hold them
    cfg, params = umt5_params_from_state_dict(sd)
    np.testing.assert_array_equal(params["token_embed"], sd["shared.weight"])
    np.testing.assert_array_equal(params["blocks"]["ffn_gate"]["kernel"][1],
                                  sd["encoder.block.1.layer.1.DenseReluDense.wi_0.weight"].T)
    with pytest.raises(ConversionError, match="unexpected key 'encoder.extra'"):
        umt5_params_from_state_dict({**sd, "encoder.extra": np.zeros(3)})
    missing = {k: v for k, v in sd.items() if k != "encoder.block.1.layer.0.layer_norm.weight"}
    with pytest.raises(ConversionError, match="missing key 'encoder.block.1.layer.0.layer_norm.weight'"):
        umt5_params_from_state_dict(missing)
    untied = {**sd, "encoder.embed_tokens.weight": sd["shared.weight"] + 1}
    with pytest.raises(ConversionError, match="differ"):
        umt5_params_from_state_dict(untied)
    with pytest.raises(ConversionError, match="cannot tell"):
        umt5_params_from_state_dict({"something.weight": np.zeros(3)})


def test_xxl_parameter_count_equals_transformers():
    import jax
    from flax import nnx

    cfg = umt5.UMT5Config.xxl()
    ours = sum(x.size for x in jax.tree.leaves(nnx.state(umt5.abstract_umt5(cfg), nnx.Param)))
    with torch.device("meta"):
        ref = transformers.UMT5EncoderModel(transformers.UMT5Config(**hf_config_dict(cfg)))
    assert ours == sum(p.numel() for p in ref.parameters())  # the tied embedding counted once
    assert 5.6e9 < ours < 5.8e9


def test_initialisation_scales_equal_transformers():
    """Random weights are drawn at T5's scales (transformers' UMT5 init). The query's is the one that
    matters: T5 does not divide logits by sqrt(d_kv), so a query drawn like the other kernels makes
    near-one-hot softmaxes that amplify rounding (batch-1 and batch-32 outputs 30 % apart at XXL)."""
    import jax
    from flax import nnx

    cfg = umt5.UMT5Config(vocab_size=512, dim=128, num_heads=4, head_dim=32, ffn_dim=256, num_layers=2)
    ours = {jax.tree_util.keystr(k): np.asarray(v) for k, v in
            jax.tree_util.tree_leaves_with_path(nnx.state(umt5.init_umt5(cfg), nnx.Param))}
    torch.manual_seed(0)
    ref = dict(transformers.UMT5EncoderModel(transformers.UMT5Config(**hf_config_dict(cfg))).named_parameters())
    names = {"q": "0.SelfAttention.q", "k": "0.SelfAttention.k", "v": "0.SelfAttention.v", "o": "0.SelfAttention.o",
             "ffn_gate": "1.DenseReluDense.wi_0", "ffn_up": "1.DenseReluDense.wi_1", "ffn_down": "1.DenseReluDense.wo"}
    for ours_name, hf_name in names.items():
        got = ours[f"['blocks']['{ours_name}']['kernel'].value"].std()
        want = ref[f"encoder.block.0.layer.{hf_name}.weight"].detach().numpy().std()
        assert abs(got / want - 1) < 0.05, f"{ours_name}: init std {got:.4f}, transformers {want:.4f}"


@pytest.mark.parametrize("num_buckets,max_distance", [(32, 128), (10, 12), (8, 16)])
def test_relative_buckets_equal_transformers(num_buckets, max_distance):
    """Up to 512 tokens, where the float32 log ratio's truncation decides boundary buckets."""
    hf = transformers.UMT5Config(relative_attention_num_buckets=num_buckets,
                                 relative_attention_max_distance=max_distance, num_heads=2, d_kv=2, d_model=4)
    attn = transformers.models.umt5.modeling_umt5.UMT5Attention(hf, has_relative_attention_bias=True)
    rel = torch.arange(512)[None, :] - torch.arange(512)[:, None]
    np.testing.assert_array_equal(umt5.relative_buckets(512, num_buckets, max_distance),
                                  attn._relative_position_bucket(rel).numpy())


def test_cleaning_follows_wans_rules():
    assert clean_prompt("  pick\tup \n the&amp;amp;cup  ") == "pick up the&cup"  # entities unescaped twice
    assert clean_prompt("cafÃ©  au lait") == "café au lait"  # ftfy repairs mojibake
    assert clean_prompt("\u3000open\u00a0the lid\u2028") == "open the lid"  # unicode whitespace too
    assert clean_prompt("") == ""


def test_tokenizer_matches_transformers_t5_tokenizer(checkpoints):
    root, tok_dir, models = checkpoints
    assert find_tokenizer(models["odd"][2]) == str(tok_dir / "spiece.model")  # beside Wan's .pth
    with pytest.raises(InputError, match="no spiece.model"):
        find_tokenizer(models["odd"][1])
    length = 12
    ours = UMT5Tokenizer(find_tokenizer(root), max_len=length)
    ref = transformers.T5Tokenizer.from_pretrained(str(tok_dir))
    cleaned = [clean_prompt(p) for p in PROMPTS]
    want = ref(cleaned, padding="max_length", truncation=True, max_length=length)  # as Wan calls it
    ids, lengths = ours(PROMPTS, length=length)
    np.testing.assert_array_equal(ids, np.asarray(want["input_ids"]))
    np.testing.assert_array_equal(lengths, np.asarray(want["attention_mask"]).sum(1))
    assert lengths.max() == length and lengths[-1] == 1  # one truncated; "" is its end token alone


def test_encoder_equals_the_reference_pipeline_at_full_padding(checkpoints):
    """Bucketed batches (short lengths, sorted, padded batch rows) give the embeddings Wan's
    pipeline gives: its tokenizer padded to max_len, the encoder, each row cut to its length."""
    root, tok_dir, models = checkpoints
    ref, _, pth = models["odd"]
    max_len = 40
    encoder = load_text_encoder(str(pth), max_len=max_len, dtype="float32", batch_size=4)
    got = encoder.encode(PROMPTS)
    hf_tok = transformers.T5Tokenizer.from_pretrained(str(tok_dir))
    t = hf_tok([clean_prompt(p) for p in PROMPTS], padding="max_length", truncation=True, max_length=max_len)
    ids, mask = np.asarray(t["input_ids"]), np.asarray(t["attention_mask"])
    want = reference(ref, ids, mask.sum(1))
    for i, emb in enumerate(got):
        n = mask[i].sum()
        assert emb.shape == (n, 24) and emb.dtype == np.float32
        assert_close(emb, want[i, :n])
    assert bucket(3, 512) == 16 and bucket(17, 512) == 32 and bucket(300, 256) == 256


def test_encode_prompts_writes_what_generate_and_preencode_read(checkpoints, tmp_path):
    import serve
    from rynn_jax.data.preencode import TextEmbeddingStore
    from rynn_jax.kinematics import streams
    from rynn_jax.teleop.camera_hands import synthetic_stream

    root, _, models = checkpoints
    _, _, pth = models["odd"]
    (tmp_path / "p.jsonl").write_text('"open the lid"\n{"task_description": "stack the green cups"}\n\n')
    episode = tmp_path / "episodes" / "ep0"
    episode.mkdir(parents=True)
    (episode / "metadata.json").write_text(json.dumps({"task_description": "open the lid"}))
    stream = synthetic_stream(5)
    stream.meta["task_description"] = "hand over the apple"
    (episode.parent / "stream0").mkdir()
    streams.write(episode.parent / "stream0" / "operator_stream.npz", stream)
    out = tmp_path / "emb"
    assert serve.main(["encode-prompts", "--checkpoint", str(pth), "--prompts", str(tmp_path / "p.jsonl"),
                       "--episodes", str(tmp_path / "episodes"), "--out", str(out), "--dtype", "float32",
                       "--text-len", "16"]) == 0
    prompts = ["", "hand over the apple", "open the lid", "stack the green cups"]
    names = {hashlib.sha256(p.encode()).hexdigest() + ".safetensors" for p in prompts}
    assert {f.name for f in out.glob("*.safetensors")} == names  # the empty prompt's included, once
    index = [json.loads(line) for line in (out / "prompts.jsonl").read_text().splitlines()]
    assert [r["prompt"] for r in index] == prompts
    encoder = load_text_encoder(str(pth), max_len=16, dtype="float32")
    store = TextEmbeddingStore(str(out), text_dim=24, text_len=16)
    for p in prompts:
        saved = load_file(str(out / (hashlib.sha256(p.encode()).hexdigest() + ".safetensors")))["text_embedding"]
        assert_close(saved, encoder(p))  # batch 32 at one length vs alone at another
        np.testing.assert_array_equal(store(p), saved)  # what preencode and generate read back

    (tmp_path / "bad.jsonl").write_text('{"caption": "x"}\n')
    with pytest.raises(InputError, match=r"bad.jsonl:1: expected a string"):
        serve.main(["encode-prompts", "--checkpoint", str(pth), "--prompts", str(tmp_path / "bad.jsonl"),
                    "--out", str(out)])
    with pytest.raises(UsageError, match="no prompts"):
        serve.main(["encode-prompts", "--checkpoint", str(pth), "--out", str(out)])


class _EchoWorldModel:
    """A StreamingSession stand-in for the tiny DiT (text_len 16, text_dim 24) that records the text
    context it is started with and shows the skeleton as the video: the generate path with
    everything but the world model's compile (≈ 100 s on 2 shared cores; the context reaching the
    real DiT is test_generate's)."""

    def __init__(self):
        from rynn_jax.models.dit import WanDiTConfig

        self.dit_cfg, self.frames_needed, self.contexts = WanDiTConfig.tiny(), 4, []

    def compile(self, *shapes):
        pass

    def start(self, images, ctx_bsk, key):
        self.contexts.append(np.asarray(ctx_bsk))

    def step(self, block):
        return block


def test_generate_encodes_a_prompt_string_with_no_precomputed_file(checkpoints, tmp_path):
    from rynn_jax.kinematics import streams
    from rynn_jax.render.preview import save_png
    from rynn_jax.serving.prompts import text_contexts
    from rynn_jax.teleop import generate as gen
    from rynn_jax.teleop.camera_hands import synthetic_stream
    from rynn_jax.teleop.demo import reference_scene
    from rynn_jax.teleop.inputs import IMAGE_FILE, STREAM_FILE

    root, tok_dir, models = checkpoints
    ref, _, pth = models["odd"]  # width 24 = the tiny DiT's text_dim
    streams_dir = tmp_path / "streams" / "s"
    streams_dir.mkdir(parents=True)
    streams.write(streams_dir / STREAM_FILE, synthetic_stream(17, seed=0))
    save_png(streams_dir / IMAGE_FILE, reference_scene(96, 160, seed=0))
    world = _EchoWorldModel()
    prompt = "open  the lid"
    summary = gen.generate(tmp_path / "streams", tmp_path / "out", num_frames=5, height=96, width=160,
                           task_description=prompt, text_encoder=str(pth), session=world)
    assert summary["written"] == {"s": 5} and not summary["failed"]
    t = transformers.T5Tokenizer.from_pretrained(str(tok_dir))(clean_prompt(prompt), truncation=True, max_length=16)
    ids = np.asarray([t["input_ids"]])
    n = ids.shape[1]
    want = reference(ref, ids, np.array([n]))[0]
    (ctx,) = world.contexts
    assert ctx.shape == (1, 16, 24) and n < 16
    assert_close(ctx[0, :n], want)
    assert not ctx[0, n:].any()  # the DiT's empty slots stay zero
    encoder = load_text_encoder(str(pth), max_len=16, dtype="float32")
    with pytest.raises(UsageError, match="--text-encoder: its embeddings are 24 wide, the DiT reads 32"):
        text_contexts(None, None, 16, 32, encoder)
    with pytest.raises(UsageError, match="--text-encoder: encodes the prompts itself"):
        gen.generate(tmp_path / "streams", tmp_path / "out2", text_encoder=str(pth), text_embeddings=str(tmp_path))


def test_text_encoder_refuses_a_tokenizer_bigger_than_its_vocabulary(checkpoints):
    root, _, _ = checkpoints
    tok = UMT5Tokenizer(find_tokenizer(root))
    model = umt5.init_umt5(umt5.UMT5Config.tiny(vocab_size=tok.vocab_size - 1))
    with pytest.raises(InputError, match="not this checkpoint's tokenizer"):
        TextEncoder(model, tok)


_SHARDED = """
import json, sys
import numpy as np
from rynn_jax import sharding
from rynn_jax.models.umt5_weights import load_umt5
from rynn_jax.text_encoder import TextEncoder, load_text_encoder
from rynn_jax.tokenizer import UMT5Tokenizer, find_tokenizer
pth, prompts = sys.argv[1], json.loads(sys.argv[2])
sharded = load_text_encoder(pth, max_len=40, dtype="float32", batch_size=3)  # 4 devices: FSDP mesh
assert sharded.mesh is not None and sharded.batch_size == 4
sharding.check_sharded(sharded._state, min_size=200)  # embedding and block weights split 4 ways
alone = TextEncoder(load_umt5(pth, dtype="float32"), UMT5Tokenizer(find_tokenizer(pth), max_len=40))
err = max(float(np.abs(a - b).max() / np.abs(b).max()) for a, b in zip(sharded.encode(prompts), alone.encode(prompts)))
print(json.dumps({"err": err}))
"""


def test_sharded_encoder_equals_single_device(checkpoints):
    """The encoder sharded over a 4-device CPU mesh by the rules table gives one device's states."""
    import os
    import subprocess
    import sys

    _, _, models = checkpoints
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=4", "JAX_PLATFORMS": "cpu"}
    proc = subprocess.run([sys.executable, "-c", _SHARDED, str(models["odd"][2]), json.dumps(PROMPTS)], env=env,
                          cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))), capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout.splitlines()[-1])["err"] <= RTOL
