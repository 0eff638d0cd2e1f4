# orchard on the CPU: the README's first command in a container.
#
#   docker build -t orchard .
#   docker run --rm -v "$PWD/runs:/runs" orchard workload=flower strategy=ring
#   docker run --rm -v "$PWD/runs:/runs" -p 127.0.0.1:5000:5000 --entrypoint mlflow orchard \
#       ui --backend-store-uri sqlite:////runs/mlflow.db --host 0.0.0.0   # published on the host's loopback only
#
# The run's store (mlflow.db) and folders (outputs/) land in the mounted /runs, as they land in
# the working directory of a plain `python -m orchard`. A CUDA image: docker/Dockerfile.cuda.
FROM python:3.11-slim

# torch from PyTorch's CPU index first (the default index's wheel brings ~3 GB of CUDA
# libraries); `pip install ".[all]"` then finds torch 2.13.0, inside its range, already there
ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu
RUN pip install --no-cache-dir torch==2.13.0 --index-url ${TORCH_INDEX}

WORKDIR /opt/orchard
COPY pyproject.toml README.md LICENSE ./
COPY orchard ./orchard
COPY workloads ./workloads
COPY conf ./conf
RUN pip install --no-cache-dir ".[all]" && python -c "import orchard, workloads.flower"

# not root: orchard keeps its store, logs and Ray's session in the user's own folders
RUN useradd --create-home orchard && mkdir /runs && chown orchard /runs
USER orchard
WORKDIR /runs
ENTRYPOINT ["python", "-m", "orchard"]
CMD ["workload=flower", "strategy=ring"]
