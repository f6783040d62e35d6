"""Pure math and training, no I/O (arrays and tensors in, arrays, tensors and dicts out):

geometry    the Lorentz model and how an old embedding space enters it
methods     the trainable bridges (HBCT and the baselines), their heads, losses and model format
hmcl        HMCL's admissible continual updates of Lorentz heads
evaluation  retrieval in the instance, query→document and class views; compatibility metrics
backfill    partial backfill: the mixed search's calibration and merge, the re-embedding plan
auto        ``auto`` (candidates tuned on validation) and the verdict a report ends with
upgrade     one backbone upgrade end to end: split, train, measure against the alternatives"""
