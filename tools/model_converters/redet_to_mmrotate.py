"""Rewrites one of our ReDet checkpoints in mmrotate's layout (mmrotate-dev 1.x
redet-le90_re50_refpn_1x_dota), which mmrotate's model loads strictly.

    python tools/model_converters/redet_to_mmrotate.py CONFIG CKPT OUT

CONFIG is the config the checkpoint was trained with. Our ReFPN keys `*_convs.i.*` become
`*_convs.i.conv.*` (mmrotate wraps each conv in a ConvModule; extra convs go after the others in
fpn_convs), and every e2cnn conv gets the `filter` (and `expanded_bias`) buffer mmrotate's models
hold, expanded from the weights by e2cnn. mmrotate's frozen stages keep the filter they load, so
it must be the real one.
mmrotate's stage 2 uses mmcv's RiRoIAlignRotated (our legacy_orientation=True): a model trained
with our continuous orientation interpolation gives somewhat different detections there.
"""
import argparse

from redet_plugin.utils.checkpoint_io import build_model, load_strictly, save_weights


def to_mmrotate_state_dict(model) -> dict:
    """The model's state dict under mmrotate's keys, with e2cnn's expanded filters (the model is
    put in eval mode, where e2cnn expands them)."""
    from redet_plugin.models.layers.equivariant import CachedFilterR2Conv
    from redet_plugin.models.necks import ReFPN
    model.eval()
    renames = [(_join(name, ours), _join(name, theirs)) for name, module in model.named_modules()
               if isinstance(module, ReFPN) for ours, theirs in module.mmrotate_prefixes()]

    def rename(key: str) -> str:
        for ours, theirs in renames:
            if key.startswith(ours):
                return theirs + key[len(ours):]
        return key

    state = {rename(key): value for key, value in model.state_dict().items()}
    for name, module in model.named_modules():
        if isinstance(module, CachedFilterR2Conv):
            state[rename(_join(name, 'filter'))] = module.filter
            if getattr(module, 'expanded_bias', None) is not None:
                state[rename(_join(name, 'expanded_bias'))] = module.expanded_bias
    return state


def _join(module_name: str, key: str) -> str:
    return f'{module_name}.{key}' if module_name else key


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('config', help='the config the checkpoint was trained with')
    parser.add_argument('checkpoint', help='our checkpoint')
    parser.add_argument('out', help='output checkpoint in mmrotate\'s layout')
    args = parser.parse_args(argv)
    model = build_model(args.config)
    meta = load_strictly(model, args.checkpoint)
    save_weights(to_mmrotate_state_dict(model), meta, args.out,
                 'tools/model_converters/redet_to_mmrotate.py')


if __name__ == '__main__':
    main()
