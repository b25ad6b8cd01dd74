"""A tiny ESPnet2 ASR training, for tests/integrations/test_espnet.py (run by ESPnet's own Python:
``SHARDIO_ESPNET_PYTHON``): ``prepare WORK`` makes the corpus (WAVs, a Kaldi dir, shape files, a token list)
and packs it with shardio; ``train WORK OUT MODE KILL_AT SAVE_EVERY [WORKERS]`` trains 2 epochs with ESPnet's
trainer (``MODE``: ``espnet``, ESPnet's own sequence iterator; ``shardio``, ``shardio_task(ASRTask)`` with
``WORKERS`` decoding processes), appending each trained batch's utterance ids to ``OUT/trained{RANK}.txt`` and
killing itself with SIGKILL before the forward of the ``KILL_AT``-th training batch (0: never; ``vN``: at the
first validation forward after N training batches, before ESPnet's epoch-end checkpoint). Under ``torchrun``
(``WORLD_SIZE`` > 1) ESPnet trains with DDP over gloo, as its trainer does with an external launcher."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import numpy as np
import soundfile as sf

CONFIG = """\
frontend: default
frontend_conf: {n_fft: 128, hop_length: 64, n_mels: 10}
specaug: null
normalize: null
encoder: transformer
encoder_conf: {output_size: 16, attention_heads: 2, linear_units: 16, num_blocks: 1, dropout_rate: 0.0,
  positional_dropout_rate: 0.0, attention_dropout_rate: 0.0, input_layer: linear}
decoder: transformer
decoder_conf: {attention_heads: 2, linear_units: 16, num_blocks: 1, dropout_rate: 0.0,
  positional_dropout_rate: 0.0, self_attention_dropout_rate: 0.0, src_attention_dropout_rate: 0.0}
model_conf: {ctc_weight: 0.5, lsm_weight: 0.0}
optim: adam
optim_conf: {lr: 0.002}
"""
WORDS = ["ab", "ba", "abc", "cab", "bca", "ca"]


def prepare(work: Path) -> None:
    data = work / "kaldi"
    (data / "wav").mkdir(parents=True)
    rng = np.random.default_rng(0)
    scp, text, shape = [], [], []
    for number in range(24):
        key = f"utt{number:03d}"
        frames = int(16000 * (0.3 + 0.05 * (number % 7)))
        audio = 0.3 * np.sin(np.arange(frames) * (0.05 + 0.01 * (number % 5))) + 0.01 * rng.standard_normal(
            frames
        )
        sf.write(data / "wav" / f"{key}.wav", audio.astype(np.float32), 16000, subtype="PCM_16")
        scp.append(f"{key} {data / 'wav' / f'{key}.wav'}\n")
        text.append(f"{key} {WORDS[number % 6]} {WORDS[(number * 5) % 6]}\n")
        shape.append(f"{key} {frames}\n")
    (data / "wav.scp").write_text("".join(scp))
    (data / "text").write_text("".join(text))
    (data / "speech_shape").write_text("".join(shape))
    (work / "tokens.txt").write_text("<blank>\n<unk>\n<space>\na\nb\nc\n<sos/eos>\n")
    (work / "conf.yaml").write_text(CONFIG)
    from shardio.cli import main

    assert main(["pack", str(data), str(work / "shards"), "--no-progress"]) == 0


def train(work: Path, out: Path, mode: str, kill: str, save_every: int, workers: int) -> None:
    from espnet2.tasks.asr import ASRTask

    from shardio.integrations.espnet import shardio_task

    base = shardio_task(ASRTask) if mode == "shardio" else ASRTask
    log = out / f"trained{os.environ.get('RANK', '0')}.txt"
    in_valid = kill.startswith("v")
    kill_at = int(kill[1:] if in_valid else kill)
    count = [0]

    def hook(module: object, args: object, kwargs: dict) -> None:
        if not getattr(module, "training", False):
            if in_valid and count[0] >= kill_at:
                os.kill(os.getpid(), signal.SIGKILL)
            return
        count[0] += 1
        if count[0] == kill_at and not in_valid:
            os.kill(os.getpid(), signal.SIGKILL)
        with open(log, "a") as handle:
            handle.write(" ".join(kwargs["utt_id"]) + "\n")
            handle.flush()
            os.fsync(handle.fileno())

    class Task(base):  # type: ignore[misc,valid-type]
        @classmethod
        def build_model(cls, args: object) -> object:
            model = super().build_model(args)
            model.register_forward_pre_hook(hook, with_kwargs=True)
            return model

    data = work / "kaldi"
    cmd = [
        "--config", str(work / "conf.yaml"), "--output_dir", str(out), "--token_type", "char",
        "--token_list", str(work / "tokens.txt"), "--ngpu", "0", "--num_workers", "0", "--seed", "0",
        "--max_epoch", "2", "--resume", "true", "--log_interval", "1", "--num_att_plot", "0",
        "--use_matplotlib", "false", "--use_tensorboard", "false", "--keep_nbest_models", "1",
        "--train_data_path_and_name_and_type", f"{data / 'wav.scp'},speech,sound",
        "--train_data_path_and_name_and_type", f"{data / 'text'},text,text",
        "--train_shape_file", str(data / "speech_shape"),
        "--valid_data_path_and_name_and_type", f"{data / 'wav.scp'},speech,sound",
        "--valid_data_path_and_name_and_type", f"{data / 'text'},text,text",
        "--valid_shape_file", str(data / "speech_shape"),
        "--batch_type", "unsorted", "--batch_size", "3",
    ]  # fmt: skip
    if mode == "shardio":
        cmd += [
            "--iterator_type",
            "task",
            "--shardio_train",
            str(work / "shards"),
            "--shardio_batch_size",
            "3",
        ]
        cmd += ["--shardio_save_every_steps", str(save_every), "--shardio_num_workers", str(workers)]
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:  # torchrun: RANK, WORLD_SIZE, MASTER_ADDR/PORT set
        cmd += ["--dist_backend", "gloo", "--multiprocessing_distributed", "false"]
    Task.main(cmd=cmd)


if __name__ == "__main__":
    if sys.argv[1] == "prepare":
        prepare(Path(sys.argv[2]))
    else:
        workers = int(sys.argv[7]) if len(sys.argv) > 7 else 0
        train(Path(sys.argv[2]), Path(sys.argv[3]), sys.argv[4], sys.argv[5], int(sys.argv[6]), workers)
