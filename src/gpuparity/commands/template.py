"""`gpuparity template slurm|apptainer`: job scripts and container definitions that start right."""
from __future__ import annotations

import argparse
import os
import shlex
import sys

from ._common import console, input_file, output_file


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "template", help="write a SLURM job script or an Apptainer definition",
        description="SLURM sbatch scripts (one GPU, one node or many nodes, with the recommended environment and a "
                    "gpuparity doctor pre-flight) and Apptainer definitions on the vendors' PyTorch images.")
    sub = parser.add_subparsers(dest="template_kind", metavar="KIND")

    slurm = sub.add_parser(
        "slurm", help="an sbatch script: srun + torchrun, recommended environment, doctor pre-flight",
        description="An sbatch script for NODES x GPUS: srun starts one torchrun per node (c10d rendezvous on the "
                    "first node), after a `gpuparity doctor --quick` on every GPU that stops the job on a failure.",
        epilog="example: gpuparity template slurm --nodes 42 --gpus-per-node 4 --vendor amd --time 04:00:00 "
               "--out job.sbatch -- python train.py --epochs 10")
    slurm.add_argument("--nodes", type=int, required=True)
    slurm.add_argument("--gpus-per-node", type=int, required=True)
    slurm.add_argument("--vendor", choices=("amd", "nvidia"), required=True)
    slurm.add_argument("--partition")
    slurm.add_argument("--time", help="SLURM time limit, e.g. 04:00:00 or 1-00:00:00")
    slurm.add_argument("--account")
    slurm.add_argument("--job-name", default="gpuparity")
    slurm.add_argument("--cpus-per-task", type=int)
    slurm.add_argument("--container", metavar="SIF", help="run the pre-flight and the job in this Apptainer image")
    slurm.add_argument("--arch", help="GPU arch of the nodes (gfx942, sm_90): lets arch-specific advice decide")
    slurm.add_argument("--platform", metavar="FILE", type=input_file,
                       help="a compute node's `gpuparity env --json` report: the environment is judged on it")
    slurm.add_argument("--no-preflight", action="store_true", help="leave out the gpuparity doctor pre-flight")
    _add_output(slurm)
    slurm.add_argument("job_command", nargs=argparse.REMAINDER, metavar="-- COMMAND",
                       help="the command to run, after --, e.g. -- python train.py --epochs 10 (required)")
    # The usage line must show the required `-- COMMAND`: argparse hides REMAINDER arguments.
    usage = slurm.format_usage().replace("usage: ", "", 1).rstrip()
    slurm.usage = (usage[:-3].rstrip() if usage.endswith("...") else usage) + " -- COMMAND ..."
    slurm.set_defaults(handler=handle_slurm, slurm_parser=slurm)

    apptainer = sub.add_parser(
        "apptainer", help="an Apptainer definition on the vendor's PyTorch image",
        description="A definition file on rocm/pytorch (AMD) or NGC / pytorch/pytorch (NVIDIA) that installs "
                    "gpuparity without replacing the image's torch and Triton, and runs gpuparity doctor in %test.")
    apptainer.add_argument("--vendor", choices=("amd", "nvidia"), required=True)
    apptainer.add_argument("--torch", metavar="VERSION", help="the torch version the image must carry, e.g. 2.7.1")
    apptainer.add_argument("--image", help="the base image (default: rocm/pytorch:latest / an NGC PyTorch release)")
    apptainer.add_argument("--source", help="what pip installs gpuparity from: a local wheel or source folder, a git "
                                            "URL, or a requirement (default: the checkout this gpuparity runs from; "
                                            "gpuparity is not on PyPI)")
    _add_output(apptainer)
    apptainer.set_defaults(handler=handle_apptainer)
    parser.set_defaults(handler=lambda args: (parser.print_help(), 2)[1])


def _add_output(parser) -> None:
    parser.add_argument("--out", metavar="FILE", type=output_file, help="write the file here (default: print it)")
    parser.add_argument("--dry-run", action="store_true", help="print the file, write nothing")


def _emit(text: str, args, executable: bool) -> int:
    if args.dry_run or not args.out:
        sys.stdout.write(text)
        return 0
    from ..report.files import write_text
    write_text(args.out, text)
    if executable:
        os.chmod(args.out, 0o755)
    console(stderr=True).print(f"wrote {args.out}")
    return 0


def _generated_by(argv) -> str:
    return "gpuparity " + " ".join(shlex.quote(a) for a in argv)


def handle_slurm(args) -> int:
    from ..templates import slurm_script
    platform = None
    if args.platform:
        from ..report.files import read_json
        platform = read_json(args.platform, "platform")
    command = list(args.job_command)
    if command[:1] == ["--"]:
        command = command[1:]
    if not command:
        args.slurm_parser.print_usage(sys.stderr)
        print("gpuparity template slurm: error: the job's command is required after --, e.g. "
              "gpuparity template slurm ... -- python train.py --epochs 10", file=sys.stderr)
        return 2
    text = slurm_script(command, nodes=args.nodes, gpus_per_node=args.gpus_per_node, vendor=args.vendor,
                        partition=args.partition, time=args.time, account=args.account, job_name=args.job_name,
                        container=args.container, preflight=not args.no_preflight, platform=platform,
                        arch=args.arch, cpus_per_task=args.cpus_per_task,
                        generated_by=_generated_by(sys.argv[1:] if sys.argv[1:2] == ["template"] else
                                                   ["template", "slurm"]))
    return _emit(text, args, executable=True)


def handle_apptainer(args) -> int:
    from ..templates import apptainer_definition
    text = apptainer_definition(args.vendor, torch_version=args.torch, image=args.image, source=args.source,
                                filename=os.path.basename(args.out) if args.out and not args.dry_run else None,
                                generated_by=_generated_by(sys.argv[1:] if sys.argv[1:2] == ["template"] else
                                                           ["template", "apptainer"]))
    return _emit(text, args, executable=False)
