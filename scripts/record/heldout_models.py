"""The two held-out models shared by record-traces.py (`moe_train`, `seg_train`) and
torch-compare.py (its `moe` and `seg` workloads), as GPT-2 is shared through
gpt2_workload.py. Both are built from their configs (random weights: no download); torch,
transformers and torchvision are imported by the caller / on first use, so importing this
module costs nothing.

  mixtral()   (config, model): a 4-layer Mixtral, 8 experts with top-2 routing (the
              per-expert token counts, so the tensor sizes, change every step)
  fcn()       FCN-ResNet50 segmentation with 21 classes
  fcn_batch() a random batch of bs images of side × side pixels with per-pixel labels
  fcn_loss()  FCN's bf16-autocast cross-entropy loss on such a batch

Each script runs its own loop around them (record-traces.py's AdamW loop and seeded choices,
torch-compare.py's shape schedule) and holds the batch as it did before this module existed
(record-traces.py until the next step's batch is made, torch-compare.py until the step
returns), so the traces recorded keep their allocation order: checked on the H200
(2026-12-01), where the scripts before and after this module recorded the same peaks for
moe_train, gpt2_generate and seg_train, run alternately.
"""


def mixtral(dev):
    """MixtralForCausalLM (vocabulary 32,000, 4 layers × 512, 8 experts, top-2) on `dev`:
    returns (config, model)."""
    from transformers import MixtralConfig, MixtralForCausalLM

    cfg = MixtralConfig(
        vocab_size=32000,
        hidden_size=512,
        intermediate_size=1408,
        num_hidden_layers=4,
        num_attention_heads=8,
        num_key_value_heads=8,
        num_local_experts=8,
        num_experts_per_tok=2,
        max_position_embeddings=1024,
    )
    return cfg, MixtralForCausalLM(cfg).to(dev)


def fcn(dev):
    """torchvision's FCN-ResNet50 (no pretrained weights, 21 classes) on `dev`."""
    import torchvision

    return torchvision.models.segmentation.fcn_resnet50(
        weights=None, weights_backbone=None, num_classes=21
    ).to(dev)


def fcn_batch(torch, bs, side, dev):
    """bs random images of side × side pixels and random per-pixel labels (21 classes) on
    `dev`: returns (images, labels). The caller keeps them: when they are freed is part of
    the workload's allocation trace."""
    x = torch.randn(bs, 3, side, side, device=dev)
    y = torch.randint(0, 21, (bs, side, side), device=dev)
    return x, y


def fcn_loss(torch, model, x, y):
    """The cross-entropy loss of `model` (from fcn()) on a batch from fcn_batch(), under
    bf16 autocast (backward not run)."""
    with torch.autocast("cuda", dtype=torch.bfloat16):
        return torch.nn.functional.cross_entropy(model(x)["out"], y)
