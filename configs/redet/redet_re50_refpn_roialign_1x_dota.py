# deprecated name; use configs/redet/redet-le90_re50_refpn_roialign_1x_dota.py
_base_ = './redet-le90_re50_refpn_roialign_1x_dota.py'
