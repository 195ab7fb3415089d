"""Writes a tiny COCO-format detection set (filled rectangles and discs on noise) for tests."""
import json
from pathlib import Path

import cv2
import numpy as np

CLASSES = ("box", "disc")


def _draw_image(rng: np.random.Generator, height: int, width: int):
    image = rng.integers(0, 60, size=(height, width, 3), dtype=np.uint8)
    annotations = []
    for category_id in (1, 2):
        w, h = (int(v) for v in rng.integers(20, 40, size=2))
        x, y = int(rng.integers(0, width - w)), int(rng.integers(0, height - h))
        colour = tuple(int(c) for c in rng.integers(150, 255, size=3))
        if category_id == 1:
            cv2.rectangle(image, (x, y), (x + w - 1, y + h - 1), colour, thickness=-1)
        else:
            cv2.ellipse(image, (x + w // 2, y + h // 2), (w // 2, h // 2), 0, 0, 360, colour, -1)
        annotations.append(dict(category_id=category_id, bbox=[x, y, w, h], area=w * h, iscrowd=0))
    return image, annotations


def write_tiny_coco(root: Path, num_train: int = 8, num_val: int = 2, height: int = 96,
                    width: int = 128, seed: int = 0) -> Path:
    """root/images/*.png, root/annotations/{train,val}.json; returns root."""
    rng = np.random.default_rng(seed)
    (root / "images").mkdir(parents=True, exist_ok=True)
    (root / "annotations").mkdir(parents=True, exist_ok=True)
    categories = [dict(id=i + 1, name=name) for i, name in enumerate(CLASSES)]
    next_ann_id = 1
    for split, count in (("train", num_train), ("val", num_val)):
        images, annotations = [], []
        for index in range(count):
            image_id = len(images) + 1
            file_name = f"{split}_{index:03d}.png"
            image, objects = _draw_image(rng, height, width)
            cv2.imwrite(str(root / "images" / file_name), image)
            images.append(dict(id=image_id, file_name=file_name, height=height, width=width))
            for obj in objects:
                annotations.append(dict(obj, id=next_ann_id, image_id=image_id))
                next_ann_id += 1
        with open(root / "annotations" / f"{split}.json", "w") as f:
            json.dump(dict(images=images, annotations=annotations, categories=categories), f)
    return root
