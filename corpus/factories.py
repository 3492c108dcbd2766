"""Factories for ``full.toml`` entries that are not a zoo model built by its own name.

Both build with random init and never download weights.
"""

from __future__ import annotations

from typing import Any

from torch import nn


def detection_backbone(name: str) -> nn.Module:
    """The backbone of torchvision detection model ``name`` (a body with FPN, or SSD's
    feature extractor); its output is an OrderedDict of feature maps."""
    import torchvision

    return torchvision.models.get_model(name, weights=None, weights_backbone=None).backbone


def timm_model(model_name: str, **kwargs: Any) -> nn.Module:
    """timm model ``model_name``, for timm models whose name a torchvision entry already has."""
    import timm

    return timm.create_model(model_name, pretrained=False, **kwargs)
