"""The datasets of the SINGA apps (section 4), one module per family: ``digits`` (scikit-learn
digits, MNIST IDX), ``cifar`` (digits_rgb, CIFAR-10 python batches), ``paired`` (digits_tags,
NUS-WIDE image/text), and ``augment`` (the deformations of a training batch).  Each loader returns a
``Dataset`` of numpy arrays; the name -> loader registry and ``load_dataset`` are in ../data.py."""
