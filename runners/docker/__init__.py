"""The Docker executor: each trial in a container of the runner image (`executor`), the
container's spec (`spec`), its cgroup (`cgroup`), the program inside it (`entry`), the images
(`images`, `python -m runners.docker.images`) and the container's sample source (`watch`).
"""
