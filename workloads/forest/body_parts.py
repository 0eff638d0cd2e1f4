"""The 31 body parts of Shotton et al. (CVPR 2011), as used by the Kinect classifier.

Label index 0..30 is a body part, index 31 (`BACKGROUND`) is everything else.
Names follow the paper's split: head and torso in quadrants (L/R x U/W, where
U = upper and W = lower), arms and legs in upper/lower segments, plus the joints.
"L" is the *person's* left, so a person facing the camera shows it on the image's
right; flipping the image on its vertical axis must swap every L part with its R twin.
"""
import numpy as np

PART_NAMES = (
    "LU_head", "RU_head", "LW_head", "RW_head", "neck",
    "L_shoulder", "R_shoulder", "LU_arm", "RU_arm", "LW_arm", "RW_arm",
    "L_elbow", "R_elbow", "L_wrist", "R_wrist", "L_hand", "R_hand",
    "LU_torso", "RU_torso", "LW_torso", "RW_torso",
    "LU_leg", "RU_leg", "LW_leg", "RW_leg",
    "L_knee", "R_knee", "L_ankle", "R_ankle", "L_foot", "R_foot",
)
NUM_PARTS = len(PART_NAMES)  # 31
BACKGROUND = NUM_PARTS  # label index of non-body pixels
PART_INDEX = {name: i for i, name in enumerate(PART_NAMES)}


def _mirror_name(name: str) -> str:
    """The name of a part's left/right twin (itself for the neck)."""
    if name.startswith("L"):
        return "R" + name[1:]
    if name.startswith("R"):
        return "L" + name[1:]
    return name


# LEFT_RIGHT_SWAP[label] = the label after flipping the image on its vertical axis.
LEFT_RIGHT_SWAP = np.array(
    [PART_INDEX[_mirror_name(n)] for n in PART_NAMES] + [BACKGROUND], dtype=np.uint8)
