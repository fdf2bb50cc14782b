"""Trials as Slurm jobs: `runners.slurm.executor` submits one job per trial from the runner
agent (or `bisect-cli run`), `runners.slurm.job` is what the job runs on the compute node,
`runners.slurm.batch` is the pure part (the sbatch command, Slurm's states and what each
means for the trial)."""
