"""DeAR's benchmark models that torchvision lacks, as `python -m syncopate.capture --module` factories.

Each factory is called as FACTORY(batch_size=B, device=D) and returns (module, loss_fn). The
models are the ones DeAR's scripts build (github.com/lzhangbv/dear_pytorch at 43138d8):
- `inception_v4`: `dear/imagenet_benchmark.py` trains `inceptionv4()` on 224x224 random images
  (its `image_size` is 224 for every model but torchvision's inception_v3). The module it imports
  is not in the repository; timm's `inception_v4` is the same architecture (Szegedy et al. 2016,
  ported from the Cadene `pretrainedmodels` implementation that PyTorch users of 2020 imported).
- `bert_base_pretraining`, `bert_large_pretraining`: `dear/bert_benchmark.py` trains
  `transformers.BertForPreTraining(config)` on random token ids with the masked-LM and
  next-sentence losses and the vocabulary padded to a multiple of 8; its sequence length comes
  from `dear/horovod_mpi_cj.sh` (`senlen` 64). The config files it reads are not in the
  repository; these are Google's published BERT-base and BERT-large shapes.
- `bert_large_squad`: BERT-large with a question-answering head on 384 tokens, the shape of the
  shipped V100 profile `bert-large`, so that the capture and that profile compare on one device
  pair (profiles/README.md, "DeAR's workloads").
"""

import torch

DEAR_SEQ_LEN = 64
SQUAD_SEQ_LEN = 384

# Google's BERT shapes (github.com/google-research/bert, README: BERT-Base L=12 H=768 A=12,
# BERT-Large L=24 H=1024 A=16; intermediate size 4 H).
BERT_BASE = {"hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12, "intermediate_size": 3072}
BERT_LARGE = {"hidden_size": 1024, "num_hidden_layers": 24, "num_attention_heads": 16, "intermediate_size": 4096}


def inception_v4(batch_size, device):
    """Inception-v4 on 224x224 random images of 1000 classes."""
    import timm

    model = timm.create_model("inception_v4", pretrained=False, num_classes=1000).to(device)
    images = torch.randn(batch_size, 3, 224, 224, device=device)
    labels = torch.randint(0, 1000, (batch_size,), device=device)
    return model, lambda: torch.nn.functional.cross_entropy(model(images), labels)


def bert_config(shape):
    """A BertConfig of `shape` with DeAR's vocabulary padded to a multiple of 8 (30522 -> 30528)."""
    import transformers

    config = transformers.BertConfig(**shape)
    config.vocab_size += -config.vocab_size % 8
    return config


def pretraining(shape, batch_size, device):
    """BertForPreTraining of `shape` on random tokens with both of its losses, as DeAR runs it."""
    import transformers

    model = transformers.BertForPreTraining(bert_config(shape)).to(device)
    tokens = torch.randint(0, 2000, (batch_size, DEAR_SEQ_LEN), device=device)
    masked = torch.randint(0, 2000, (batch_size, DEAR_SEQ_LEN), device=device)
    next_sentence = torch.randint(0, 2, (batch_size,), device=device)
    return model, lambda: model(input_ids=tokens, labels=masked, next_sentence_label=next_sentence).loss


def bert_base_pretraining(batch_size, device):
    return pretraining(BERT_BASE, batch_size, device)


def bert_large_pretraining(batch_size, device):
    return pretraining(BERT_LARGE, batch_size, device)


def bert_large_squad(batch_size, device):
    """BERT-large with a question-answering head on 384 random tokens (the shipped profile's shape)."""
    import transformers

    model = transformers.BertForQuestionAnswering(transformers.BertConfig(**BERT_LARGE)).to(device)
    tokens = torch.randint(0, model.config.vocab_size, (batch_size, SQUAD_SEQ_LEN), device=device)
    start = torch.randint(0, SQUAD_SEQ_LEN, (batch_size,), device=device)
    end = torch.clamp(start + 8, max=SQUAD_SEQ_LEN - 1)
    return model, lambda: model(input_ids=tokens, start_positions=start, end_positions=end).loss
