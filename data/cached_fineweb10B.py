"""Download the pre-tokenized FineWeb shards the speedrun trains on.

    python data/cached_fineweb10B.py 8

fetches fineweb_val_000000.bin and fineweb_train_000001.bin .. fineweb_train_00000N.bin from the
Hugging Face dataset kjj0/fineweb10B-gpt2 into data/fineweb10B/. Each shard holds 100M GPT-2
tokens (about 200 MB); 8 cover the 0.73B training tokens of the reference run. Files already
present with a valid header are skipped, and every download is checked before it counts.

    python data/cached_fineweb10B.py --for_run [train_gpt.py's arguments]

fetches only what that run of train_gpt.py reads (run.sh does this): nothing for --train_files
or --val_files that point elsewhere, and as many train shards as its steps take.
"""
import argparse
import fnmatch
import sys
from pathlib import Path

from huggingface_hub import hf_hub_download
from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError, RemoteEntryNotFoundError
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from train_gpt import DOWNLOAD_HINT, UserError, check_shard, parse_args  # noqa: E402  (its rules)

REPO_ID = "kjj0/fineweb10B-gpt2"
DEFAULT_DIR = Path(__file__).resolve().parent / "fineweb10B"
VAL_NAME = "fineweb_val_000000.bin"
SHARD_TOKENS = 100_000_000  # in every shard of the dataset


def shard_names(num_train, val=True):
    return ([VAL_NAME] if val else []) + [f"fineweb_train_{i:06d}.bin"
                                          for i in range(1, num_train + 1)]


def shards_for_run(argv, local_dir=DEFAULT_DIR):
    """(whether the val shard, how many train shards) train_gpt.py reads from `local_dir` when
    run with the arguments `argv`. The loader leaves a shard of N tokens after (N - 2) // B
    batches of B tokens, so the first shards alone give the run the same batches as all of them."""
    if {"-h", "--help"} & set(argv):  # the script only prints its help
        return False, 0
    args = parse_args(argv)

    def reads(pattern, name):
        pattern = Path(pattern)
        return pattern.parent.resolve() == Path(local_dir).resolve() and fnmatch.fnmatch(
            name, pattern.name)
    batches_per_shard = max(1, (SHARD_TOKENS - 2) // args.batch_size)
    num_train = -(-args.num_iterations // batches_per_shard)  # rounded up
    return (reads(args.val_files, VAL_NAME),
            num_train if reads(args.train_files, "fineweb_train_000001.bin") else 0)


def download(num_train, local_dir=DEFAULT_DIR, val=True):
    """Fetch the val shard (unless not `val`) and the first `num_train` train shards; return
    their paths."""
    local_dir = Path(local_dir)
    paths = []
    for name in tqdm(shard_names(num_train, val), desc=f"shards in {local_dir}", unit="file"):
        path = local_dir / name
        try:
            check_shard(path)
            tqdm.write(f"{path} is present and valid, skipped")
        except FileNotFoundError:
            hf_hub_download(REPO_ID, name, repo_type="dataset", local_dir=local_dir)
        except UserError as err:
            tqdm.write(f"{err}\ndownloading it again")
            hf_hub_download(REPO_ID, name, repo_type="dataset", local_dir=local_dir,
                            force_download=True)
        check_shard(path)
        paths.append(path)
    return paths


def one_line(err):
    return " ".join(str(err).split()) or type(err).__name__


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("num_train", nargs="?", type=int,
                        help="number of 100M-token train shards (default 8, the reference run)")
    parser.add_argument("--dir", default=DEFAULT_DIR, help=f"target folder (default {DEFAULT_DIR})")
    parser.add_argument("--for_run", nargs=argparse.REMAINDER, metavar="ARGUMENTS",
                        help="instead of num_train: only what train_gpt.py run with these "
                             "arguments reads (must come last)")
    args = parser.parse_args(argv)
    if args.num_train is not None and args.for_run is not None:
        parser.error(f"give the number of train shards ({args.num_train}) or --for_run, not both")
    val, num_train = True, 8 if args.num_train is None else args.num_train
    if num_train < 0:
        parser.error(f"number of train shards must be 0 or more, got {num_train}")
    if args.for_run is not None:
        try:
            val, num_train = shards_for_run(args.for_run, args.dir)
        except UserError as err:  # an argument train_gpt.py would refuse too
            sys.exit(f"error: {err}")
    try:
        if val or num_train:
            download(num_train, args.dir, val)
    except RemoteEntryNotFoundError as err:
        sys.exit(f"error: {one_line(err)}\nThe dataset {REPO_ID} has no such file: ask for "
                 f"fewer train shards.")
    except (HfHubHTTPError, LocalEntryNotFoundError, OSError) as err:
        sys.exit(f"error: could not download from the Hugging Face dataset {REPO_ID}: "
                 f"{one_line(err)}\nCheck the network connection (and HF_ENDPOINT if set), then "
                 f"run this again: shards already downloaded are kept.")
    except UserError as err:  # its advice, to download the shards, is this very command
        sys.exit(f"error: a downloaded shard is not valid: "
                 f"{str(err).removesuffix('; ' + DOWNLOAD_HINT)}; run this again to fetch it anew")


if __name__ == "__main__":
    main()
