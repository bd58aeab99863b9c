;; A component that, before describe() runs, instantiates 16 core instances of a module whose
;; memory starts at 30 MiB: each memory is under a 32 MiB cap, all of them together 480 MiB.
;; The memory cap is per call, across every memory: its second memory is refused.
(component
  (component $inner
    (type $kind (enum "controller-service" "nodeset-pod"))
    (export $k "builder-kind" (type $kind))
    (type $info (record
      (field "name" string)
      (field "version" string)
      (field "kinds" (list $k))
      (field "contract-version" string)))
    (export $i "plugin-info" (type $info))
    (core module $big
      (memory (export "memory") 480))
    (core instance $b0 (instantiate $big))
    (core instance $b1 (instantiate $big))
    (core instance $b2 (instantiate $big))
    (core instance $b3 (instantiate $big))
    (core instance $b4 (instantiate $big))
    (core instance $b5 (instantiate $big))
    (core instance $b6 (instantiate $big))
    (core instance $b7 (instantiate $big))
    (core instance $b8 (instantiate $big))
    (core instance $b9 (instantiate $big))
    (core instance $b10 (instantiate $big))
    (core instance $b11 (instantiate $big))
    (core instance $b12 (instantiate $big))
    (core instance $b13 (instantiate $big))
    (core instance $b14 (instantiate $big))
    (core instance $b15 (instantiate $big))
    (core module $m
      (memory (export "memory") 1)
      (func (export "describe") (result i32) unreachable))
    (core instance $ci (instantiate $m))
    (func $describe (result $i) (canon lift (core func $ci "describe") (memory (core memory $ci "memory"))))
    (export "describe" (func $describe)))
  (instance $plugin (instantiate $inner))
  (export "slinky:builder/plugin@0.1.0" (instance $plugin)))
