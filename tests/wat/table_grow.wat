;; Test guest `table_grow`: a core module that tests/build.rs turns into a
;; component exporting `warden:plugin/tool@0.1.0` (Rust cannot emit
;; `table.grow`, so this one is written by hand).
;;
;; Its one tool, `table_grow` (arguments ignored), grows a funcref table by
;; 4096 elements at a time until `table.grow` returns -1, then returns
;; `failed("table.grow failed")`. A host that traps on a refused grow ends the
;; call before that; a host without a table limit lets it grow until memory
;; runs out.
;;
;; Canonical ABI used below (all offsets in bytes):
;;   list<tool-spec>            return area: ptr @0, len @4
;;   tool-spec (size 28)        name @0, description @8, input-schema @16
;;                              (each string ptr, len), effect u8 @24
;;   result<T, tool-error>      tag u8 @0 (0 ok, 1 err), payload @4;
;;     preview / tool-output    strings from @4
;;     tool-error               case u8 @4 (2 = failed), failure.message @8,
;;                              failure.retryable u8 @16
(module
  (memory (export "memory") 1)
  (table $table 0 funcref)

  ;; Bump allocator state: the next free byte. Below 4096 is static data.
  (global $heap (mut i32) (i32.const 4096))

  ;; Return areas and the one tool-spec record.
  (global $describe_ret i32 (i32.const 256))
  (global $result_ret i32 (i32.const 272))
  (global $spec i32 (i32.const 320))

  (data (i32.const 1024) "table_grow")                                                     ;; 10
  (data (i32.const 1040) "Runs table.grow until it fails, then returns a failed error.")   ;; 60
  (data (i32.const 1152) "{\"type\":\"object\"}")                                          ;; 17
  (data (i32.const 1184) "grow the function table until table.grow fails")                 ;; 46
  (data (i32.const 1232) "table.grow failed")                                              ;; 17

  ;; describe: func() -> list<tool-spec>
  (func (export "warden:plugin/tool@0.1.0#describe") (result i32)
    (i32.store offset=0 (global.get $spec) (i32.const 1024))
    (i32.store offset=4 (global.get $spec) (i32.const 10))
    (i32.store offset=8 (global.get $spec) (i32.const 1040))
    (i32.store offset=12 (global.get $spec) (i32.const 60))
    (i32.store offset=16 (global.get $spec) (i32.const 1152))
    (i32.store offset=20 (global.get $spec) (i32.const 17))
    ;; effect: read
    (i32.store8 offset=24 (global.get $spec) (i32.const 0))
    (i32.store offset=0 (global.get $describe_ret) (global.get $spec))
    (i32.store offset=4 (global.get $describe_ret) (i32.const 1))
    (global.get $describe_ret))

  ;; preflight: func(call) -> result<preview, tool-error>; the call's five
  ;; strings arrive flattened as ten i32s.
  (func (export "warden:plugin/tool@0.1.0#preflight")
    (param i32 i32 i32 i32 i32 i32 i32 i32 i32 i32) (result i32)
    (i32.store8 offset=0 (global.get $result_ret) (i32.const 0))
    (i32.store offset=4 (global.get $result_ret) (i32.const 1184))
    (i32.store offset=8 (global.get $result_ret) (i32.const 46))
    ;; detail: empty
    (i32.store offset=12 (global.get $result_ret) (i32.const 1))
    (i32.store offset=16 (global.get $result_ret) (i32.const 0))
    (global.get $result_ret))

  ;; invoke: func(call) -> result<tool-output, tool-error>
  (func (export "warden:plugin/tool@0.1.0#invoke")
    (param i32 i32 i32 i32 i32 i32 i32 i32 i32 i32) (result i32)
    (block $refused
      (loop $grow
        (br_if $refused
          (i32.eq
            (table.grow $table (ref.null func) (i32.const 4096))
            (i32.const -1)))
        (br $grow)))
    ;; err(failed({message: "table.grow failed", retryable: false}))
    (i32.store8 offset=0 (global.get $result_ret) (i32.const 1))
    (i32.store8 offset=4 (global.get $result_ret) (i32.const 2))
    (i32.store offset=8 (global.get $result_ret) (i32.const 1232))
    (i32.store offset=12 (global.get $result_ret) (i32.const 17))
    (i32.store8 offset=16 (global.get $result_ret) (i32.const 0))
    (global.get $result_ret))

  ;; cabi_realloc: the canonical ABI allocator, a bump allocator that grows
  ;; memory as needed and never frees (each call runs in a fresh instance).
  (func (export "cabi_realloc")
    (param $old i32) (param $old_len i32) (param $align i32) (param $new_len i32)
    (result i32)
    (local $ptr i32) (local $end i32) (local $pages i32)
    ;; ptr = align_up(heap, align)
    (local.set $ptr
      (i32.and
        (i32.add (global.get $heap) (i32.sub (local.get $align) (i32.const 1)))
        (i32.sub (i32.const 0) (local.get $align))))
    (local.set $end (i32.add (local.get $ptr) (local.get $new_len)))
    ;; grow memory to cover [ptr, end)
    (local.set $pages
      (i32.sub
        (i32.shr_u (i32.add (local.get $end) (i32.const 65535)) (i32.const 16))
        (memory.size)))
    (if (i32.gt_s (local.get $pages) (i32.const 0))
      (then
        (if (i32.eq (memory.grow (local.get $pages)) (i32.const -1))
          (then unreachable))))
    (global.set $heap (local.get $end))
    ;; a reallocation keeps the old bytes
    (if (local.get $old_len)
      (then
        (memory.copy
          (local.get $ptr)
          (local.get $old)
          (select
            (local.get $old_len)
            (local.get $new_len)
            (i32.lt_u (local.get $old_len) (local.get $new_len))))))
    (local.get $ptr))
)
