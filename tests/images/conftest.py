"""The catalogue image built once per module (`sandhive-test-extra`) and its folder, shared by
the images test modules."""

from tests.images.test_images_worker import extra_image, folder

__all__ = ["extra_image", "folder"]
