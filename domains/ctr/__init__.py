"""The CTR domain: its column contract (:mod:`.schema`), the engine's item catalogue
(:mod:`.catalogue`), the Feast store of the cross features (:mod:`.feature_store`), its bulk
loader (:mod:`.online_bulk`) and encoders (:mod:`.online_encoding`), packed layout
(:mod:`.online_packed`) and online reader (:mod:`.online_cross`)."""
