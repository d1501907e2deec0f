"""Datasets in the formats robot-learning tools read, both directions.

  episode.py   a robot-layout episode folder read whole; the flat per-frame hand features
  lerobot.py   LeRobot v3: export (pyarrow + PyAV) and LeRobotSource
  rlds.py      RLDS through a TFDS builder (ArrayRecord, no TensorFlow): export and RldsSource
  export.py    CLI: python -m rynn_jax.data.formats.export --format {lerobot,rlds} --episodes DIR --out DIR
"""
